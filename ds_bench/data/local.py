"""Local files through HuggingFace ``datasets``, never the hub; ds_bench's own cache folder.

``--data PATH`` always names local files, so the hub is switched off before ``datasets`` is first
imported (``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE``; without them a lookup may hang retrying on
a machine with no route out). Values the user has set are kept.
"""

from __future__ import annotations

import logging
import os

from ds_bench.errors import UserError
from ds_bench.machine import environ

log = logging.getLogger("ds_bench")
CACHE_ENV = "DS_BENCH_CACHE"


def cache_dir(*parts: str) -> str:
    """``$DS_BENCH_CACHE`` (default ``~/.cache/ds_bench``) / parts, created."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ds_bench")
    path = os.path.join(root, *parts)
    os.makedirs(path, exist_ok=True)
    return path


def load_local_dataset(builder: str, flag_value: str, **kwargs):
    """``datasets.load_dataset(builder, split="train", **kwargs)`` offline; errors name ``--data``."""
    environ.hub_offline()
    import datasets

    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(builder, split="train", **kwargs)
    except (ValueError, FileNotFoundError, datasets.exceptions.DatasetGenerationError) as e:
        cause = e.__cause__ or e
        raise UserError(f"--data {flag_value}: datasets {builder!r} loader failed: "
                        f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}") from None
