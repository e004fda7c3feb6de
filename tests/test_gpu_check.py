"""The GPU tier's wiring, checked where there is no GPU (CPU suite): ``make gpu-check`` says in one line that it
skipped, writes nothing and exits 0; every ``ds-bench`` command the GPU tests run (``tests/gpu_commands.py``) passes
``ds-bench``'s own checks up to joining the process group, so a wrong flag fails here, not in the rare minutes a GPU
is lent; the FusedAdam override gives DeepSpeed's own optimizer op; ``make gpu-wheels``' list carries what
``make gpu-check`` finds missing, and its wheels stay out of git."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from ds_bench import cli
from ds_bench.config.deepspeed.optim import check_optimizer
from ds_bench.config.deepspeed.prepare import apply_overrides
from ds_bench.errors import UserError
from ds_bench.machine.jit_ops import optimizer_op
from tests import gpu_commands as cmd
from tests.conftest import PASSED, REPO, child_env, stop_past_checks
from tools import gpu_check, gpu_wheels


def test_make_gpu_check_without_a_gpu_says_so_in_one_line_and_writes_nothing(tmp_path):
    """Also on a machine with a GPU: its GPU hidden (``CUDA_VISIBLE_DEVICES`` empty)."""
    results = REPO / "results"
    before = sorted(results.glob("gpu-check-*")) if results.exists() else []
    env = {k: v for k, v in child_env(CUDA_VISIBLE_DEVICES="").items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    proc = subprocess.run(["make", "--no-print-directory", "gpu-check", f"GPU_OUT={tmp_path / 'out'}"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr == "" and proc.stdout.endswith("\n") and proc.stdout.count("\n") == 1, proc.stdout
    assert proc.stdout.startswith("gpu-check: skipped: no CUDA GPU") and "nothing written" in proc.stdout
    assert not (tmp_path / "out").exists()
    assert (sorted(results.glob("gpu-check-*")) if results.exists() else []) == before


RUNS = {**cmd.CHECK_RUNS, **cmd.TIMED_RUNS, **cmd.DEEPCOMPILE_RUNS}
FP16_TO_BF16 = ("--set", "fp16.enabled=false", "--set", "bf16.enabled=true")


def on_cpu(argv: tuple[str, ...]) -> list[str]:
    """A GPU run as CPU ranks take it, everything else as it is: fp16 as bf16 (fp16 is refused on CPU ranks),
    no ``--checkpoint-offload`` (GPU ranks only: a CPU rank's activations are in host memory already) and no
    ``--deepcompile`` (CUDA only: its refusal on CPU ranks is a bad-input row), SDPA for flash-attn (a CUDA package;
    the GPU test checks its refusal)."""
    out = [a.replace("flash_attention_2", "sdpa") for a in argv if a not in ("--checkpoint-offload", "--deepcompile")]
    return out + list(FP16_TO_BF16) if any(a.endswith("_fp16.json") for a in argv) else out


@pytest.fixture
def stopped_at_the_join(monkeypatch):
    stop_past_checks(monkeypatch)
    from ds_bench.machine import memory

    monkeypatch.setattr(memory, "cap_process_memory", lambda *_a, **_k: None)
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")  # the best runs compile: refused with dynamo switched off
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_BENCH_IFACE"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("name", RUNS)
def test_every_gpu_run_passes_the_checks(name, tmp_path, capsys, stopped_at_the_join):
    code = cli.main(["run", *on_cpu(RUNS[name]), "--results", str(tmp_path / "r.jsonl"), "--tag", "t"])
    err = capsys.readouterr().err
    assert code != 2 and PASSED in err, err[-3000:]


@pytest.mark.parametrize("argv", [cmd.ROOFLINE, cmd.COMM, cmd.CAPACITY], ids=lambda argv: argv[0])
def test_every_gpu_study_passes_the_checks(argv, tmp_path, capsys, stopped_at_the_join):
    code = cli.main([*argv, "--results", str(tmp_path / "r.jsonl")])
    err = capsys.readouterr().err
    assert code != 2 and PASSED in err, err[-3000:]


def test_the_fused_adam_override_makes_deepspeed_build_its_fused_adam():
    for shipped in ("zero2.json", "zero2_fp16.json"):
        base = json.loads((REPO / "ds_configs" / shipped).read_text())
        assert optimizer_op(base) is None  # torch's fused AdamW: no DeepSpeed op
        fused = apply_overrides(base, (cmd.FUSED_ADAM,))
        assert optimizer_op(fused) == "fused_adam" and fused["optimizer"]["type"] == "AdamW"
        resolved = apply_overrides(fused, ("optimizer.params.lr=1e-3", "optimizer.params.betas=[0.9, 0.999]",
                                           "optimizer.params.eps=1e-8", "optimizer.params.weight_decay=0"))
        check_optimizer(resolved, shipped)  # FusedAdam takes every parameter left
        with pytest.raises(UserError, match="optimizer.params.fused is not a parameter of .*FusedAdam"):
            check_optimizer(apply_overrides(resolved, ("optimizer.params.fused=true",)), shipped)


def test_the_carried_wheels_hold_every_module_make_gpu_check_needs_and_stay_out_of_git():
    from importlib.metadata import packages_distributions

    dists = packages_distributions()
    for module in gpu_check.NEEDED:
        assert {d.lower().replace("_", "-") for d in dists[module]} & set(gpu_wheels.CARRIED), module
    assert subprocess.run(["git", "check-ignore", "-q", ".gpu/wheels/deepspeed-0.19.8-py3-none-any.whl"],
                          cwd=REPO).returncode == 0


@pytest.mark.parametrize("wheel, fits", [
    ("deepspeed-0.19.8-py3-none-any.whl", True),
    ("python_hostlist-2.3.0-py2.py3-none-any.whl", True),
    ("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", True),
    ("pydantic_core-2.50.5-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", False),
    ("rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_aarch64.whl", False),
    ("rpds_py-2026.9.1-cp312-cp312-macosx_11_0_arm64.whl", False),
    ("old-1.0-py2-none-any.whl", False),
])
def test_a_wheel_fits_the_gpu_machine_only_for_cpython_312_on_x86_64_linux(wheel, fits):
    assert gpu_wheels.fits_the_gpu_machine(wheel) is fits


def test_the_step_after_pytest_tables_and_pages_whatever_records_the_folder_holds(tmp_path):
    """``tools/gpu_check.py``'s last step on real records of this suite's fixtures (CPU runs, a roofline, a capacity
    search): machine.json, figures.md (its rows say what is missing: none of these runs is the GPU tier's) and
    report.html."""
    for name in ("runs.jsonl", "roofline.jsonl", "capacity.jsonl"):
        (tmp_path / name).write_text((REPO / "tests" / "data" / "report" / name).read_text())
    machine = {"gpu": "NVIDIA H100 80GB HBM3", "driver": "580.159.04", "memory_mib": 81559}
    assert gpu_check.finish(tmp_path, gpu_check.child_env(tmp_path, []), machine, ["pytest: 15 passed"],
                            "make gpu-check")
    assert json.loads((tmp_path / "machine.json").read_text()) == machine
    figures = (tmp_path / "figures.md").read_text()
    assert figures.startswith("# GPU check, ") and "- command: `make gpu-check`" in figures
    assert "driver 580.159.04" in figures and "- pytest: 15 passed" in figures
    assert "missing: no run tagged gpu-check:gpt2-small-default" in figures and "| matmul | fp32 |" in figures
    page = (tmp_path / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "Ceiling" in page and "Capacity" in page


def test_past_its_budget_the_check_stops_pytest_and_its_runs_and_still_tables_what_it_has(tmp_path, monkeypatch,
                                                                                          capsys):
    """A GPU check whose first part outlasts ``--budget``: pytest and what it started are stopped, the next part is
    not started, the page says so, the exit is 1 (the GPU faked: ``no_gpu`` says there is one)."""
    slow = tmp_path / "test_slow.py"
    slow.write_text("import subprocess, pytest\n\n\n@pytest.mark.gpu\ndef test_slow():\n"
                    "    subprocess.run(['sleep', '97.5'])\n")
    monkeypatch.setattr(gpu_check, "no_gpu", lambda: None)
    monkeypatch.setattr(gpu_check, "AFTER_S", 0.0)
    monkeypatch.setattr(gpu_check, "PHASES", (("checks", str(slow), True), ("timed", str(slow), False)))
    assert gpu_check.main(["--out", str(tmp_path / "out"), "--budget", "6"]) == 1
    figures = (tmp_path / "out" / "figures.md").read_text()
    assert re.search(rf"- pytest {re.escape(str(slow))}( \(4 at a time\))?: stopped at the budget after \d+ s", figures)
    assert f"- pytest {slow}: not run, the budget was spent" in figures
    assert subprocess.run(["pgrep", "-f", "sleep 97.5"], capture_output=True).returncode == 1  # none left
    assert capsys.readouterr().out.rstrip().endswith(f"gpu-check: FAILED; figures {tmp_path}/out/figures.md, page "
                                                     f"{tmp_path}/out/report.html")
