"""File locks between processes: ``file_lock`` serialises the ranks (or runs) that would fill the
same cache entry or build the same op (the first does it, the others wait, then read it), with a
bounded wait and no lock where ``flock`` is unsupported.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("ds_bench")
LOCK_POLL_S = 0.2


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
