"""The stack axis for real (``full`` tier): environments built with uv beside ``.venv`` (``machine.stack_envs``),
sweeps whose points run with another DeepSpeed's Python, on 2 CPU ranks.

- A sweep over ``--deepspeed 0.17.6,installed`` (MNIST, fp32, ZeRO 1 and 2 with gradient accumulation 2 and
  clipping, as DeepSpeed #7718 was reported) resumes after Ctrl-C without running a finished point again, and
  ``compare --stacks`` catches #7718: 0.17.6's ZeRO-2 gradient norms differ from the first step, its losses later;
  ZeRO-1 trains the same on both.
- The oldest supported stack (``config.stacks.SUPPORTED``: each package's oldest release together) passes its core
  subset: every ZeRO stage, Llama under the deepspeed launcher, and the bad-input path: a feature newer than its
  releases refused in one line, by the sweep (skipped, saying so) and by ``ds-bench run`` in that environment (exit
  2, before joining).
- A version the registry does not have is one line, exit 2, nothing written.

Each environment is built once per checkout (~30 s with uv's warm cache; a DeepSpeed release's CPU ops ~2-3 min the
first time on this machine, then from the op store).
"""

from __future__ import annotations

import os
import sys

import pytest

from ds_bench.config.stacks import PACKAGES, SUPPORTED, installed_versions, public, stacks_of
from ds_bench.machine.stack_envs import env_path, stacks_root
from tests.conftest import ds_bench, explain, interrupt_after_first_ok, records, run_cmd

pytestmark = pytest.mark.full
BUGGY = "0.17.6"
"""A release with DeepSpeed #7718 (ZeRO-2 gradients wrong with accumulation, 0.17.6-0.18.2; fixed in 0.18.3)."""
HERE = public(installed_versions()["deepspeed"])
MNIST = ["--workload", "mnist", "--ds-config", "zero2.json", "--precision", "fp32", "--micro-batch", "8",
         "--grad-accum", "2", "--steps", "6", "--warmup", "1", "--timeout", "10m"]


def points(path):
    return [r for r in records(path) if r.get("kind") == "sweep_point"]


def test_a_sweep_over_two_releases_resumes_after_ctrl_c_and_compare_catches_deepspeed_7718(tmp_path):
    results = tmp_path / "s.jsonl"
    argv = [sys.executable, "-m", "ds_bench", "sweep", *MNIST, "--stages", "1,2", "--deepspeed", f"{BUGGY},installed",
            "--results", str(results), "--master-port", "29661"]
    interrupt_after_first_ok(argv, tmp_path / "first.log", 900, lambda: points(results))  # 0.17.6's environment first
    assert sum(r["status"] == "ok" for r in points(results)) == 1
    again = run_cmd(argv, timeout=900)
    assert again.returncode == 0, explain(again)
    assert "attempt(s) recorded before: finished points are kept" in again.stdout
    ok = [r for r in points(results) if r["status"] == "ok"]
    assert sorted(r["key"] for r in ok) == sorted(f"z{z} off=none fp32 mbs=8 ga=2 stack=ds{v}" for z in (1, 2)
                                                  for v in (BUGGY, HERE))
    assert len({r["run_id"] for r in ok}) == 4  # no finished point ran twice
    assert {r["point"]["stack"]: r["versions"]["deepspeed"] for r in ok} == {f"ds{BUGGY}": BUGGY, f"ds{HERE}": HERE}

    compared = ds_bench("compare", str(results), "--stacks", f"ds{BUGGY},ds{HERE}")
    assert compared.returncode == 1, explain(compared)  # as fast, maybe, but wrong
    rows = {line.split(": ", 1)[1].split("  ")[0]: line for line in compared.stdout.splitlines()
            if line.startswith("sweep mnist 2 ranks: ")}
    assert "gradient norm differs from step 1" in rows["z2 off=none fp32 mbs=8 ga=2"], compared.stdout
    assert "same curves (6 steps)" in rows["z1 off=none fp32 mbs=8 ga=2"], compared.stdout  # ZeRO-1 is right
    assert "1 with different losses or gradient norms" in compared.stdout


OLDEST = ["--deepspeed", SUPPORTED["deepspeed"], "--transformers", SUPPORTED["transformers"]]
"""The oldest DeepSpeed and transformers together. The oldest torch (2.6.0, a CUDA build here) is its own stack:
deepspeed 0.16.0 cannot be imported beside a CUDA torch on a machine without a GPU (its triton kernels autotune at
import: ``RuntimeError: 0 active drivers``)."""


@pytest.mark.parametrize("stack", [OLDEST, ["--torch", SUPPORTED["torch"]]], ids=["deepspeed-transformers", "torch"])
def test_the_oldest_supported_stack_passes_its_core_subset(stack, tmp_path):
    """A 2-rank point per ZeRO stage on the stack of the oldest releases; then, for the oldest DeepSpeed and
    transformers, Llama under the deepspeed launcher, and a feature newer than the stack refused in one line, by the
    sweep (skipped, saying so) and by ``ds-bench run`` in its environment (exit 2, before joining)."""
    results = tmp_path / "s.jsonl"
    swept = ds_bench("sweep", *MNIST, "--stages", "0,1,2,3", *stack, "--results", str(results),
                     "--master-port", "29662", timeout=1500)
    assert swept.returncode == 0, explain(swept)
    ok = [r for r in points(results) if r["status"] == "ok"]
    assert sorted(r["point"]["stage"] for r in ok) == [0, 1, 2, 3]
    named = dict(zip(stack[::2], stack[1::2]))
    assert {tuple(public(r["versions"][p.name]) for p in PACKAGES if p.flag in named) for r in ok} == {
        tuple(named[p.flag] for p in PACKAGES if p.flag in named)}
    if stack != OLDEST:
        return

    llama = ["--workload", "llama", "--size", "tiny", "--seq-len", "64", "--ds-config", "zero1.json", "--micro-batch",
             "1", "--steps", "4", "--warmup", "1", "--precision", "fp32", "--timeout", "10m", *OLDEST]
    launched = ds_bench("sweep", *llama, "--launcher", "deepspeed", "--sequence-parallel", "1,2",
                        "--results", str(tmp_path / "l.jsonl"), "--master-port", "29663", HF_HUB_OFFLINE="1",
                        timeout=900)
    assert launched.returncode == 0, explain(launched)
    by_key = {r["key"].split(" stack=")[0]: r for r in points(tmp_path / "l.jsonl")}
    assert by_key["z1 off=none fp32 mbs=1"]["status"] == "ok", by_key
    skipped = by_key["sp2 z1 off=none fp32 mbs=1"]
    assert skipped["status"] == "skipped" and skipped["reason"].startswith(
        f"--sequence-parallel 2 needs deepspeed 0.18.1 or newer; this stack has deepspeed {SUPPORTED['deepspeed']}")

    oldest = stacks_of({"deepspeed": (SUPPORTED["deepspeed"],), "transformers": (SUPPORTED["transformers"],)},
                       installed_versions())[0]
    python = os.path.join(env_path(oldest, stacks_root()), "bin", "python")
    refused = run_cmd([python, "-m", "ds_bench", "run", "--workload", "moe", "--size", "tiny", "--seq-len", "64",
                       "--ds-config", "ds_configs/zero1.json", "--results", str(tmp_path / "r.jsonl")])
    errors = [line for line in refused.stderr.splitlines() if line.startswith("ds-bench: error:")]
    assert refused.returncode == 2 and len(errors) == 1 and "Traceback" not in refused.stderr, explain(refused)
    assert errors[0].startswith(f"ds-bench: error: --workload moe needs transformers 5.0.0 or newer; this stack has "
                                f"transformers {SUPPORTED['transformers']}")
    assert not (tmp_path / "r.jsonl").exists()


def test_a_release_the_registry_does_not_have_is_one_line_before_anything_runs(tmp_path):
    results = tmp_path / "s.jsonl"
    done = ds_bench("sweep", *MNIST, "--stages", "1", "--deepspeed", "0.16.99", "--results", str(results),
                    DS_BENCH_STACKS=str(tmp_path / "stacks"))
    errors = [line for line in done.stderr.splitlines() if line.startswith("ds-bench: error:")]
    assert done.returncode == 2 and len(errors) == 1 and "Traceback" not in done.stderr, explain(done)
    assert errors[0].startswith("ds-bench: error: --deepspeed 0.16.99: cannot be installed here: ")
    assert not results.exists() and not (tmp_path / "stacks" / "deepspeed0.16.99" / "ds_bench-stack.json").exists()
