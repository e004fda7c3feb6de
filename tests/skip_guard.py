"""A skip is a failure unless it is allowed: on this project's machines and in CI every capability the suite uses
exists (root, network namespaces, a writable cgroup cpu controller, Open MPI and mpi4py, chromium, Slurm, tmpfs),
so a test that skips for a missing one has silently stopped covering what it covers. Only the GPU tier (``gpu``
marker) may skip without a GPU. ``DS_BENCH_ALLOW_SKIPS=1`` lets a developer's machine that lacks one skip as before.

Registered by tests/conftest.py (``pytest_plugins``); tests/test_skip_guard.py runs it on a file of its own.
"""

from __future__ import annotations

import os

import pytest

ALLOW_SKIPS = "DS_BENCH_ALLOW_SKIPS"


def may_skip(markers: set[str], environ) -> bool:
    """Whether a test with these markers may end skipped (pure)."""
    return "gpu" in markers or environ.get(ALLOW_SKIPS) == "1"


def skip_reason(longrepr) -> str:
    """The reason pytest keeps for a skip: ``(file, line, "Skipped: why")``."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    if may_skip({m.name for m in item.iter_markers()}, os.environ):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped where nothing may be: {skip_reason(report.longrepr)} (this machine lacks what the "
                       f"test needs; {ALLOW_SKIPS}=1 lets it skip)")
