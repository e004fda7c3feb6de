"""MNIST-family idx files (``*-ubyte`` or ``*-ubyte.gz``): MNIST, Fashion-MNIST, KMNIST.

Accepts a folder holding ``train-images-idx3-ubyte[.gz]`` and ``train-labels-idx1-ubyte[.gz]``,
or torchvision's layout (``ROOT/MNIST/raw/...``, ``ROOT/FashionMNIST/raw/...``). Format:
http://yann.lecun.com/exdb/mnist/ (big-endian magic, dims, then uint8 data).
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib

import numpy as np
import torch

from ds_bench.errors import UserError

SUBDIRS = ("", "raw", "MNIST/raw", "FashionMNIST/raw", "KMNIST/raw")
_DTYPES = {0x08: np.uint8}


def find_split(root: str, split: str = "train") -> tuple[str, str]:
    """Paths of the images and labels files of ``split`` ("train" or "t10k") under ``root``."""
    for sub in SUBDIRS:
        folder = os.path.join(root, sub)
        images = _first_existing(folder, f"{split}-images-idx3-ubyte")
        labels = _first_existing(folder, f"{split}-labels-idx1-ubyte")
        if images and labels:
            return images, labels
    raise UserError(f"--data {root}: no {split}-images-idx3-ubyte[.gz] and {split}-labels-idx1-ubyte[.gz] "
                    f"found (looked in {', '.join(s or '.' for s in SUBDIRS)})")


def read_idx(path: str) -> np.ndarray:
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError, zlib.error) as e:  # gzip: truncated (EOFError), corrupt (zlib.error, BadGzipFile)
        raise UserError(f"{path}: cannot read idx file ({e})") from None
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _DTYPES:
        raise UserError(f"{path}: not an idx file of unsigned bytes (bad magic number)")
    ndim = data[3]
    if len(data) < 4 + 4 * ndim:
        raise UserError(f"{path}: idx header truncated (expects {ndim} dimensions)")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(dims)):
        raise UserError(f"{path}: header says {dims} but holds {body.size} values")
    return body.reshape(dims)


def load_split(root: str, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 [N, H, W], labels int64 [N]) of one split."""
    images_path, labels_path = find_split(root, split)
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise UserError(f"--data {root}: images {images.shape} in {images_path} and labels {labels.shape} "
                        f"in {labels_path} do not pair up (expected [N, H, W] images and [N] labels)")
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.astype(np.int64))


def _first_existing(folder: str, stem: str) -> str | None:
    for name in (stem, stem + ".gz"):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            return path
    return None
