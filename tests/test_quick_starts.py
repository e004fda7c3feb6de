"""The documentation's CPU quick starts run as written (issue 45): every fenced block of README.md and docs/*.md
that a page marks as one, on this machine, within a bound taken from the page's own figure.

A page marks a quick start with an HTML comment right before the fence, which rendered Markdown does not show;
the page's prose says the same figure with its date, command and hardware:

    <!-- quick-start cpu: 24 s -->
    ```bash
    torchrun --nproc_per_node 2 -m ds_bench run ...
    ```

The CI tier checks the markers (each before a bash block, with a figure; the pages that must have one have one).
The full tier runs each marked block with ``bash -e`` in a scratch copy of the repository's tracked files (nothing
is written into the repository), in at most ``BOUND`` x the page's figure, every command ending 0; whatever a block
leaves in the copy must be git-ignored (``results/``, ``/lc/``): run output never shows up in ``git status``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, child_env, explain, kill_session

MARK = re.compile(r"^<!-- quick-start cpu: (\d+) s -->\n```bash\n(.*?)^```", re.M | re.S)
BOUND = 3
"""A block may take this many times its page's figure (instances of this machine's image differ ~2x:
../shared/ENVIRONMENT.md)."""
PAGES_WITH_ONE = ("README.md", "docs/moe.md", "docs/plan.md", "docs/long-context.md")
"""Pages with a CPU quick start. Left out: README's ``make bench`` (4-5 min from a fresh clone, its own figure; the
sweep it runs is tests/test_distributed.py's), the Slurm page's (they need the Slurm bed: tests/test_slurm_real.py),
and commands a page sizes for GPUs."""


def quick_starts() -> list[tuple[str, int, str]]:
    """(page, figure in seconds, the block's text) of every marked block, in page order."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return [(str(p.relative_to(REPO)), int(m.group(1)), m.group(2)) for p in pages
            for m in MARK.finditer(p.read_text(encoding="utf-8"))]


def test_every_marker_is_before_a_bash_block_and_the_pages_have_theirs():
    marked = quick_starts()
    every = sum(p.read_text(encoding="utf-8").count("<!-- quick-start")
                for p in [REPO / "README.md", *(REPO / "docs").glob("*.md")])
    assert every == len(marked), "a <!-- quick-start cpu: N s --> line not right before a ```bash fence"
    assert set(PAGES_WITH_ONE) <= {page for page, _, _ in marked}
    for page, seconds, block in marked:
        assert 0 < seconds <= 240 and block.strip(), (page, seconds)
        assert "..." not in block, f"{page}: a quick start runs as written"


def scratch_copy(into: Path) -> Path:
    """The repository's tracked files (as they are in the working tree) under ``into``."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, into / name)
    return into


def run_block(block: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """``bash -e`` on the block in ``cwd`` (its own session: every rank is killed on a timeout)."""
    env = child_env(PYTHONPATH=str(cwd))
    with subprocess.Popen(["bash", "-e", "-c", block], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            kill_session(proc)
            raise
    return subprocess.CompletedProcess(block, proc.returncode, out, err)


def left_behind(copy: Path, before: set[Path]) -> list[str]:
    """Files a block wrote into the copy that the repository's .gitignore does not cover."""
    new = [str(p.relative_to(copy)) for p in copy.rglob("*") if p.is_file() and p not in before]
    new = [n for n in new if "__pycache__" not in n]
    if not new:
        return []
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO, input="\n".join(new),
                             capture_output=True, text=True).stdout.split()
    return sorted(set(new) - set(ignored))


@pytest.mark.full
@pytest.mark.solo  # its bounds are this machine's figures: no other test's runs beside it
@pytest.mark.parametrize("page,seconds,block", quick_starts(), ids=[p for p, _, _ in quick_starts()])
def test_a_quick_start_runs_as_written_within_its_pages_figure(page, seconds, block, tmp_path):
    copy = scratch_copy(tmp_path / "repo")
    before = set(copy.rglob("*"))
    started = time.monotonic()
    proc = run_block(block, copy, timeout=BOUND * seconds)
    took = time.monotonic() - started
    assert proc.returncode == 0, explain(proc)
    assert took <= BOUND * seconds, f"{page}: {took:.0f} s, the page says {seconds} s"
    assert left_behind(copy, before) == [], f"{page}: run output outside results/ and .gitignore"
