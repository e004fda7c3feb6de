"""Text for causal-LM workloads: local text / JSON-lines files -> one token stream -> packed sequences.

``--data PATH`` is a file or a folder of files: ``.txt`` / ``.text`` (read line by line with line
breaks kept, so the stream is the file's text) and ``.json`` / ``.jsonl`` (one record per line with
a ``"text"`` field; an end-of-text token follows each record), loaded with HF ``datasets``.

Tokenizing happens once: the stream is cached as ``$DS_BENCH_CACHE/tokens/<key>.npy``, the key
hashing each file's path, size and mtime and the tokenizer's full definition, so a changed file or
vocabulary is re-tokenized. Tokenizing happens before the process group is joined (so the length
of the data is checked before joining): ranks sharing a cache take an ``flock`` on
``<key>.npy.lock`` beside the entry; the first tokenizes and writes the entry atomically, the
others wait (bounded by ``wait_s``) and read it. Without ``flock`` or past the wait, a rank
tokenizes alone; the atomic write keeps the entry whole either way. Empty files hold no text and
are skipped (HF's loaders cannot infer a schema from them). Packing cuts the stream into full
``seq_len`` windows (the remainder is dropped, as in HF's run_clm ``group_texts``).
"""

from __future__ import annotations

import hashlib
import logging
import os

import numpy as np
import torch

from ds_bench.data.local import cache_dir, load_local_dataset
from ds_bench.errors import UserError
from ds_bench.machine.locks import file_lock

TEXT_SUFFIXES = (".txt", ".text")
JSON_SUFFIXES = (".json", ".jsonl")
log = logging.getLogger("ds_bench")
TOKENIZE_CHUNK = 2000  # rows per tokenizer call
LOCK_WAIT_S = 600.0  # default bound on waiting for another rank's tokenizing


def find_text_files(path: str) -> list[str]:
    """The non-empty text / JSON-lines files ``--data`` names, sorted; a UserError when there are none."""
    if os.path.isfile(path):
        files = [path]
    else:
        files = sorted(os.path.join(path, f) for f in os.listdir(path))
    files = [f for f in files if os.path.isfile(f) and f.lower().endswith(TEXT_SUFFIXES + JSON_SUFFIXES)]
    if not files:
        raise UserError(f"--data {path}: no text files ({', '.join(TEXT_SUFFIXES + JSON_SUFFIXES)}) found")
    non_empty = [f for f in files if os.path.getsize(f) > 0]
    if not non_empty:
        what = "the file is empty" if files == [path] else f"all {len(files)} text files are empty"
        raise UserError(f"--data {path}: {what} (0 bytes, no text to train on)")
    return non_empty


def token_stream(files: list[str], tokenizer, flag_value: str, wait_s: float = LOCK_WAIT_S) -> np.ndarray:
    """All files' tokens, concatenated in order; from the cache when it is current, else tokenized
    by the first process to take the entry's lock while the others wait for it."""
    path = os.path.join(cache_dir("tokens"), cache_key(files, tokenizer) + ".npy")
    if not os.path.isfile(path):
        with file_lock(path + ".lock", wait_s):
            if not os.path.isfile(path):  # written by the lock's previous holder?
                log.info("tokenizing %d file(s) of --data %s into %s", len(files), flag_value, path)
                _save_atomic(path, _tokenize(files, tokenizer, flag_value))
    return np.load(path)


def pack(tokens: np.ndarray, seq_len: int) -> torch.Tensor:
    """[n, seq_len] int64 full windows of the stream; the tail shorter than seq_len is dropped."""
    n = len(tokens) // seq_len
    return torch.from_numpy(tokens[:n * seq_len].astype(np.int64)).view(n, seq_len)


def cache_key(files: list[str], tokenizer) -> str:
    h = hashlib.sha256()
    for f in files:
        st = os.stat(f)
        h.update(f"{os.path.abspath(f)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    h.update(tokenizer.backend_tokenizer.to_str().encode())
    return h.hexdigest()[:32]


def _tokenize(files: list[str], tokenizer, flag_value: str) -> np.ndarray:
    texts = [f for f in files if f.lower().endswith(TEXT_SUFFIXES)]
    jsons = [f for f in files if f.lower().endswith(JSON_SUFFIXES)]
    parts = []
    if texts:
        rows = load_local_dataset("text", flag_value, data_files=texts, keep_linebreaks=True)["text"]
        parts += _encode(rows, tokenizer, eos=None)
    if jsons:
        ds = load_local_dataset("json", flag_value, data_files=jsons)
        if "text" not in ds.column_names:
            raise UserError(f"--data {flag_value}: JSON records need a \"text\" field; found "
                            f"{', '.join(ds.column_names) or 'none'}")
        parts += _encode(ds["text"], tokenizer, eos=tokenizer.eos_token_id)
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return ids.astype(np.uint16 if len(tokenizer) <= 2**16 else np.int32)


def _encode(rows: list[str], tokenizer, eos: int | None) -> list[np.ndarray]:
    out = []
    for start in range(0, len(rows), TOKENIZE_CHUNK):
        for ids in tokenizer(rows[start:start + TOKENIZE_CHUNK])["input_ids"]:
            out.append(np.asarray(ids + ([eos] if eos is not None else []), dtype=np.int64))
    return out


def _save_atomic(path: str, array: np.ndarray) -> None:
    tmp = f"{path}.{os.getpid()}.tmp.npy"
    np.save(tmp, array)
    os.replace(tmp, path)

