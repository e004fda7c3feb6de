"""tests/skip_guard.py: a skip that is not the GPU tier's fails, with its reason, unless DS_BENCH_ALLOW_SKIPS=1;
run for real on a test file of its own through pytest with the plugin."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.skip_guard import may_skip, skip_reason

FILE = '''
import pytest

def test_needs_a_capability():
    pytest.skip("no writable cgroup cpu controller")

@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("no CUDA GPU on this machine")

@pytest.mark.xfail(reason="known")
def test_expected_to_fail():
    assert False

def test_fine():
    pass
'''


def pytest_run(tmp_path, allow: str | None) -> subprocess.CompletedProcess:
    (tmp_path / "test_x.py").write_text(FILE)
    env = {"PATH": "/usr/bin:/bin", **({"DS_BENCH_ALLOW_SKIPS": allow} if allow is not None else {})}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.skip_guard", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", "/dev/null", str(tmp_path / "test_x.py")],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_a_capability_skip_fails_with_its_reason(tmp_path):
    done = pytest_run(tmp_path, None)
    assert done.returncode == 1, done.stdout
    assert "1 failed, 1 passed, 1 skipped, 1 xfailed" in done.stdout, done.stdout
    assert "skipped where nothing may be: no writable cgroup cpu controller" in done.stdout


def test_a_developer_may_let_skips_pass(tmp_path):
    done = pytest_run(tmp_path, "1")
    assert done.returncode == 0 and "1 passed, 2 skipped, 1 xfailed" in done.stdout, done.stdout


def test_only_the_gpu_tier_skips_by_itself():
    assert may_skip({"gpu"}, {}) and not may_skip({"dist", "full"}, {}) and may_skip(set(), {"DS_BENCH_ALLOW_SKIPS": "1"})
    assert not may_skip(set(), {"DS_BENCH_ALLOW_SKIPS": "0"})
    assert skip_reason(("f.py", 3, "Skipped: no tmpfs")) == "no tmpfs"


def test_ci_runs_the_readme_command_then_only_the_full_tier():
    """``.ci/run``: ``make test`` (the README's command, CI's tier), then the tests only the full tier runs, not the
    CI tier again and not the GPU tier (its tests would skip here)."""
    lines = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    assert [line for line in lines if line.startswith("make")] == ["make test", "make test-full-only"]
    readme = (REPO / "README.md").read_text()
    assert re.search(r"^make test +#", readme, re.M)
    dry = subprocess.run(["make", "-n", "test-full-only"], cwd=REPO, capture_output=True, text=True, timeout=60)
    pytest_lines = [line for line in dry.stdout.splitlines() if " -m pytest " in line]
    assert len(pytest_lines) == 1 and '-m "full and not gpu"' in pytest_lines[0], dry.stdout
