"""Images for classification workloads: an idx folder or a class-per-subfolder image folder.

The format is read off ``--data PATH``: MNIST-family idx files present -> idx (grey, repeated to 3
channels); otherwise an image folder (``PATH/<class>/<image>``, loaded with HF ``datasets``
"imagefolder", classes numbered in sorted name order). Either way a batch is decoded on the fly,
resized to ``image_size`` x ``image_size`` (bilinear, ``torch.nn.functional.interpolate``) and
normalized with the ImageNet channel mean / std that ResNet training uses.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from ds_bench.data.idx import find_split, load_split, read_idx
from ds_bench.data.local import load_local_dataset
from ds_bench.errors import UserError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")

Fetch = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""indices -> (uint8 images [n, C, H, W], int64 labels [n])."""


def detect_format(path: str) -> str:
    """``idx`` or ``imagefolder``; a UserError naming --data when it is neither."""
    if os.path.isdir(path) and _has_idx(path):
        return "idx"
    if os.path.isdir(path) and len(folder_classes(path)) >= 1:
        return "imagefolder"
    raise UserError(f"--data {path}: neither idx files (train-images-idx3-ubyte[.gz]) nor an image folder "
                    f"with one subfolder of images per class")


def folder_classes(path: str) -> list[str]:
    """Class names of an image folder: the names of the folders that directly hold images."""
    names = set()
    for folder, _dirs, files in os.walk(path):
        if folder != path and any(f.lower().endswith(IMAGE_SUFFIXES) for f in files):
            names.add(os.path.basename(folder))
    return sorted(names)


def num_classes(path: str, fmt: str) -> int:
    if fmt == "idx":
        _, labels_path = find_split(path, "train")
        return int(read_idx(labels_path).max()) + 1
    return len(folder_classes(path))


def normalize(images: torch.Tensor, image_size: int) -> torch.Tensor:
    """uint8 [N, C, H, W] (C = 1 or 3) -> float [N, 3, S, S], resized and ImageNet-normalized."""
    x = images.float().div_(255.0)
    if x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    if x.shape[-2:] != (image_size, image_size):
        x = F.interpolate(x, size=(image_size, image_size), mode="bilinear", align_corners=False)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def idx_source(path: str) -> tuple[int, Fetch]:
    """(number of samples, fetch) over the train split; images come back grey, [n, 1, H, W]."""
    images, labels = load_split(path, "train")
    return len(images), lambda idx: (images[idx].unsqueeze(1), labels[idx])


def folder_source(path: str, image_size: int) -> tuple[int, Fetch]:
    """(number of samples, fetch) over an image folder; images come back RGB, [n, 3, S, S]."""
    ds = load_local_dataset("imagefolder", path, data_dir=path)
    if "label" not in ds.column_names:
        raise UserError(f"--data {path}: image folder has no class subfolders (no labels)")
    if len(ds) == 0:
        raise UserError(f"--data {path}: image folder holds no images")
    _check_first_image(ds, path, image_size)

    def fetch(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = ds[idx.tolist()]
        pixels = torch.stack([_decode(img, image_size) for img in rows["image"]])
        return pixels, torch.tensor(rows["label"], dtype=torch.int64)

    return len(ds), fetch


def _check_first_image(ds, path: str, image_size: int) -> None:
    """Decode image 0 now (``datasets`` decodes lazily), so a broken file is a UserError before the
    run starts; its file is named. Later images are decoded as batches are drawn."""
    try:
        _decode(ds[0]["image"], image_size)
    except (OSError, ValueError, SyntaxError) as e:  # PIL: UnidentifiedImageError (OSError), truncated...
        import datasets

        name = ds.cast_column("image", datasets.Image(decode=False))[0]["image"]["path"]
        raise UserError(f"--data {path}: cannot decode image {name}: {e}") from None


def _decode(image, image_size: int) -> torch.Tensor:
    """PIL image -> uint8 [3, S, S] (any mode converted to RGB; resized so batches stack)."""
    arr = torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.uint8).copy()).permute(2, 0, 1)
    if arr.shape[-2:] == (image_size, image_size):
        return arr
    resized = F.interpolate(arr.unsqueeze(0).float(), size=(image_size, image_size), mode="bilinear",
                            align_corners=False)
    return resized.round().clamp_(0, 255).to(torch.uint8).squeeze(0)


def batches(fetch: Fetch, indices: Iterator[torch.Tensor], image_size: int) -> Iterator[dict[str, torch.Tensor]]:
    for idx in indices:
        pixels, labels = fetch(idx)
        yield {"pixel_values": normalize(pixels, image_size), "labels": labels}


def _has_idx(path: str) -> bool:
    try:
        find_split(path, "train")
    except UserError:
        return False
    return True

