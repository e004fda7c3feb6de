"""tests/solo.py: under pytest-xdist a ``solo`` test runs with no other test beside it, and the others still run
side by side; run for real on test files of their own through pytest -n 2 with the plugin."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO
from tests.solo import lock_paths

FILE = '''
import json, os, time
import pytest

def spend(name):
    start = time.monotonic()
    time.sleep(1.0)
    with open(os.environ["SOLO_LOG"], "a") as f:
        f.write(json.dumps([name, start, time.monotonic()]) + "\\n")

@pytest.mark.solo
def test_solo_{n}():
    spend("solo_{n}")

@pytest.mark.parametrize("i", range(3))
def test_plain_{n}(i):
    spend(f"plain_{n}_{{i}}")
'''


def test_a_solo_test_overlaps_no_other_and_the_others_still_run_side_by_side(tmp_path):
    for n in (1, 2):  # one file per worker (--dist loadfile), each with a solo test and three plain ones
        (tmp_path / f"test_{n}.py").write_text(FILE.format(n=n))
    log = tmp_path / "log.jsonl"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "tests.solo",
                           "-p", "no:cacheprovider", "--rootdir", str(tmp_path), "-c", "/dev/null",
                           "-o", "markers=solo", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "SOLO_LOG": str(log)})
    assert done.returncode == 0 and "8 passed" in done.stdout, done.stdout + done.stderr
    spans = [json.loads(line) for line in log.read_text().splitlines()]
    solo = [s for s in spans if s[0].startswith("solo")]
    overlaps = [(a[0], b[0]) for a in spans for b in spans if a is not b and a[1] < b[2] and b[1] < a[2]]
    assert len(solo) == 2 and not [o for o in overlaps if o[0].startswith("solo")], overlaps
    assert overlaps, "the plain tests of the two files never ran side by side"


def test_without_xdist_nothing_is_locked():
    assert lock_paths(None) is None and lock_paths("") is None
    lock, gate = lock_paths("abc")
    assert lock != gate and "abc" in lock
