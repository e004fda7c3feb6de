"""run_scripts/reliability.sh: DRY_RUN prints the rotation and runs nothing."""

import os
import subprocess

from tests.conftest import REPO


def test_dry_run_prints_every_launcher_and_stage_and_runs_nothing(tmp_path):
    results = tmp_path / "r.jsonl"
    proc = subprocess.run(["bash", "run_scripts/reliability.sh", "12", str(results)], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "DRY_RUN": "1"})
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0 and lines[-1] == "DRY_RUN: 12 commands printed, nothing run", proc.stdout
    pairs = {(line.split()[0].rsplit("/", 1)[-1], line.split("zero")[1][0]) for line in lines[:-1]}
    assert pairs == {(launcher, str(stage)) for launcher in ("torchrun", "deepspeed", "mpirun") for stage in range(4)}
    assert not results.exists() and "failed" not in proc.stdout
