"""Tests marked ``solo`` have the machine to themselves under pytest-xdist.

A test whose assertion is a figure of this machine (expectations of throughput, a slowdown told from noise, step
times against predictions) fails when another worker's real runs share the 2 cores: the acceptance run's MNIST
sweep point measured 166.8 images/s against its 250 expectation while the other worker ran a capacity search
(2026-11-26, full tier). A ``solo`` test therefore waits until no other test runs and keeps the others waiting
until it ends; the rest run side by side as before.

A readers-writer lock over two ``flock`` files named for the xdist run (``PYTEST_XDIST_TESTRUNUID``): every test
holds ``lock`` shared, a solo test exclusive; a solo test holds ``gate`` while it waits, which every test passes
through before taking ``lock``, so a stream of other tests cannot starve it. Each wait is bounded (``WAIT_S``):
past it the test runs anyway and says so. Without xdist (one process) nothing is locked.
"""

from __future__ import annotations

import fcntl
import os
import time
import warnings

import pytest

WAIT_S = 1800.0
"""The longest a test waits for the lock: well above the longest test of the full tier (~6 min)."""
POLL_S = 0.2


def lock_paths(run_id: str | None) -> tuple[str, str] | None:
    """(lock, gate) for one xdist run; None without xdist (pure)."""
    if not run_id:
        return None
    base = f"/tmp/ds_bench-tests-{os.getuid()}-{run_id}"
    return f"{base}.lock", f"{base}.gate"


def take(fd: int, mode: int, what: str, wait_s: float = WAIT_S) -> bool:
    """``flock(fd, mode)``, polling, for at most ``wait_s``; False (and a warning) when it timed out."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                warnings.warn(f"waited {wait_s:.0f} s for {what}; running without it", stacklevel=2)
                return False
            time.sleep(POLL_S)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outside pytest-timeout's wrapper: the wait is no test's time
def pytest_runtest_protocol(item, nextitem):
    paths = lock_paths(os.environ.get("PYTEST_XDIST_TESTRUNUID"))
    if paths is None:
        yield
        return
    lock, gate = (os.open(p, os.O_CREAT | os.O_RDWR, 0o600) for p in paths)
    try:
        if item.get_closest_marker("solo"):
            take(gate, fcntl.LOCK_EX, "the gate")
            take(lock, fcntl.LOCK_EX, "the other tests to end")
        else:
            if take(gate, fcntl.LOCK_EX, "a solo test to end"):
                fcntl.flock(gate, fcntl.LOCK_UN)
            take(lock, fcntl.LOCK_SH, "a solo test to end")
        yield
    finally:
        for fd in (lock, gate):
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
