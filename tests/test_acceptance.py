"""``run_scripts/acceptance.sh`` (and its Slurm form, ``acceptance.sbatch``): doctor -> comm --pairs ->
scaling -> a short sweep -> report --html, one command for a new allocation.

In CI: ``DRY_RUN=1`` prints the five commands, in that order, each one ds-bench's parser accepts (a launch's
command after ``--`` included); the .sbatch's start its ranks with srun on the allocation's hosts and
scale over a hostfile it writes only when it runs. Full tier (~2 min): the real thing here, 2 CPU ranks,
ends 0 with every expectation of docs/expect.cpu.yaml passing and a page with each step's section.
"""

import re
import shlex
import subprocess
import sys

import pytest

from ds_bench import cli
from tests.conftest import REPO, child_env, explain

STEPS = ["launch", "launch", "scaling", "sweep", "report"]


def dry_run(script: str, **env: str) -> list[list[str]]:
    proc = subprocess.run(["bash", f"run_scripts/{script}"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env=child_env(DRY_RUN="1", PYTHON=".venv/bin/python", **env))
    assert proc.returncode == 0, explain(proc)
    return [shlex.split(line) for line in proc.stdout.strip().splitlines()]


def ds_bench_args(argv: list[str]) -> list[str]:
    assert argv[1:3] == ["-m", "ds_bench"], argv
    return argv[3:]


def parses(argv: list[str]) -> None:
    """ds-bench's parser takes the command, and a scaling's run options after ``--`` are ``run``'s."""
    from ds_bench.config.run_flags import parse_run_tail

    cli.parse(argv)  # raises on a flag the command does not take
    if argv[0] == "scaling":
        tail = argv[argv.index("--") + 1:]
        parse_run_tail(["--workload", argv[argv.index("--workload") + 1], "--ds-config", "zero1.json"], tail)


def test_the_dry_run_prints_the_five_steps_and_each_parses():
    commands = [ds_bench_args(a) for a in dry_run("acceptance.sh", OUT="results/acc-dry")]
    assert [c[0] for c in commands] == STEPS
    assert commands[0][commands[0].index("--") + 1] == "doctor" and "--pairs" in commands[1]
    for argv in commands:
        parses(argv)
    report = commands[-1]
    assert report[report.index("--expect") + 1] == "docs/expect.cpu.yaml"
    assert [a for a in report if a.endswith(".jsonl")] == [f"results/acc-dry/{n}.jsonl" for n in
                                                           ("doctor", "comm", "scaling", "sweep")]
    assert not (REPO / "results/acc-dry").exists()


@pytest.mark.parametrize("script", ["acceptance.sh", "acceptance.sbatch"])
def test_an_upgrade_s_acceptance_sweeps_both_stacks_and_compares_them(script):
    """``STACKS``: the sweep runs on the current and the candidate stack, then ``compare --stacks`` (its exit and
    page: docs/stacks.md), before the report, whose Stacks section judges them too."""
    commands = [ds_bench_args(a) for a in dry_run(script, OUT="results/acc-dry", SLURM_JOB_NODELIST="n[1-2]",
                                                  STACKS="--deepspeed installed,0.18.4")]
    assert [c[0] for c in commands] == [*STEPS[:-1], "compare", "report"]
    sweep, compare = commands[3], commands[4]
    assert sweep[sweep.index("--deepspeed") + 1] == "installed,0.18.4"
    assert compare == ["compare", "results/acc-dry/sweep.jsonl", "--stacks", "--html", "results/acc-dry/upgrade.html"]
    for argv in commands:
        parses(argv)


def test_the_sbatch_starts_ranks_with_srun_and_scales_over_the_allocation(tmp_path):
    out = tmp_path / "acc"
    commands = [ds_bench_args(a) for a in dry_run("acceptance.sbatch", OUT=str(out),
                                                  SLURM_JOB_NODELIST="gpu[01-04]", SLURM_NNODES="4")]
    assert [c[0] for c in commands] == STEPS
    assert commands[0][:2] == ["launch", "srun"] and "--iface" not in commands[0]  # IFACE unset: ds_bench chooses
    scaling = commands[2]
    assert scaling[scaling.index("--nodes") + 1] == "1,2,4" and scaling[scaling.index("--launcher") + 1] == "mpirun"
    assert commands[-1][commands[-1].index("--expect") + 1] == "docs/expect.example.yaml"
    assert not out.exists()  # the hostfile is written when it runs, not on a dry run
    for argv in commands:
        parses(argv)


@pytest.mark.full
@pytest.mark.solo  # asserts this machine's figures: no other test's runs beside it
def test_a_real_acceptance_run_here_passes_its_expectations(tmp_path):
    out = tmp_path / "acc"
    proc = subprocess.run(["bash", "run_scripts/acceptance.sh"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env=child_env(OUT=str(out), PYTHON=sys.executable))
    assert proc.returncode == 0, explain(proc)
    assert re.search(r"expectations \(docs/expect.cpu.yaml\): 4 pass, 0 fail, 0 not measured", proc.stdout)
    page = (out / "acceptance.html").read_text()
    for section in ("expectations", "doctor", "comm", "scaling", "sweep", "failures"):
        assert f'<section id="{section}"' in page
