"""Local files through HuggingFace ``datasets``, never the hub; ds_bench's own cache folder and its locks.

``--data PATH`` always names local files, so the hub is switched off before ``datasets`` is first
imported (``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE``; without them a lookup may hang retrying on
a machine with no route out). Values the user has set are kept.

``file_lock`` serialises the ranks that would fill the same cache entry (the first fills it, the
others wait, then read it), with a bounded wait and no lock where ``flock`` is unsupported.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ds_bench.errors import UserError

log = logging.getLogger("ds_bench")
LOCK_POLL_S = 0.2

CACHE_ENV = "DS_BENCH_CACHE"


def cache_dir(*parts: str) -> str:
    """``$DS_BENCH_CACHE`` (default ``~/.cache/ds_bench``) / parts, created."""
    root = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "ds_bench")
    path = os.path.join(root, *parts)
    os.makedirs(path, exist_ok=True)
    return path


def load_local_dataset(builder: str, flag_value: str, **kwargs):
    """``datasets.load_dataset(builder, split="train", **kwargs)`` offline; errors name ``--data``."""
    from ds_bench.cluster.process import hub_offline

    hub_offline()
    import datasets

    datasets.disable_progress_bars()
    try:
        return datasets.load_dataset(builder, split="train", **kwargs)
    except (ValueError, FileNotFoundError, datasets.exceptions.DatasetGenerationError) as e:
        cause = e.__cause__ or e
        raise UserError(f"--data {flag_value}: datasets {builder!r} loader failed: "
                        f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}") from None


@contextmanager
def file_lock(path: str, timeout_s: float) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing, left in place) for the block.

    Yields True when held; False when waiting exceeded ``timeout_s`` or the file system has no
    ``flock`` (some network file systems). Callers then go on unlocked, so what they write under
    the lock must be written atomically anyway. The kernel drops the lock when its holder dies:
    a killed rank never leaves a stale lock.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        log.warning("no lock %s (%s): going on unlocked", path, e.strerror)
        yield False
        return
    try:
        yield _acquire(fd, path, timeout_s)
    finally:
        os.close(fd)  # releases the lock


def _acquire(fd: int, path: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                log.warning("waited %.0f s for lock %s: going on without it", timeout_s, path)
                return False
            time.sleep(LOCK_POLL_S)
        except OSError as e:  # ENOLCK, EOPNOTSUPP, EINVAL: no flock on this file system
            log.info("flock unsupported for %s (%s): going on unlocked", path, e.strerror)
            return False
