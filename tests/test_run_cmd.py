"""tests/conftest.py's ``run_cmd``: a command that outlasts its timeout takes every process it started with it,
as a killed torchrun must take its ranks; real processes, a real timeout."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import run_cmd

PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def test_a_timed_out_command_leaves_no_process_of_its_own_behind():
    with pytest.raises(subprocess.TimeoutExpired) as timed_out:
        run_cmd([sys.executable, "-c", PARENT], timeout=5)
    printed = timed_out.value.output
    child = int((printed.decode() if isinstance(printed, bytes) else printed).split()[0])
    deadline = time.monotonic() + 10
    while alive(child):
        assert time.monotonic() < deadline, f"the command's child {child} outlived its timeout"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Running, or stopped: not gone and not a zombie awaiting its reaper."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_command_that_ends_returns_its_exit_status_and_output():
    done = run_cmd([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
