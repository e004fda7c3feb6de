"""``ds-bench compare``: matching two results files and a verdict that respects noise.

Pure: the verdict on inline samples (Mann-Whitney U with repeats, single samples said so, the threshold,
lower-is-better metrics), the matching keys of each record kind. The command on files written here: exit
1 on a slower match, 0 otherwise (exit 2 on bad input: ``tests/test_bad_inputs.py``). Real (``full`` tier, 9 one-rank MNIST runs on one core, ~4.5 min): a
slowdown made for real (a noisy neighbour on the run's core) is called slower, and two healthy sets of runs
are called the same.
"""

import contextlib
import json
import os
import subprocess
import sys

import pytest

from ds_bench import cli
from ds_bench.record.schema import model_of
from ds_bench.report.compare_match import samples
from ds_bench.report.compare_verdict import judge
from tests.conftest import ds_bench, explain, records, run_cmd


def test_three_repeats_fully_apart_and_beyond_the_threshold_are_slower():
    v = judge([100, 101, 99], [80, 81, 79])
    assert (v.verdict, v.single_sample, v.change_pct, v.p_value) == ("slower", False, -20.0, pytest.approx(0.05))
    assert v.regression and judge([100, 101, 99], [120, 121, 119]).verdict == "faster"


def test_overlapping_samples_or_a_change_within_the_threshold_are_the_same():
    assert judge([100, 80, 120], [90, 70, 110]).verdict == "same"  # -10% of the medians, but overlapping
    assert judge([100, 101, 99], [97, 98, 96]).verdict == "same"  # fully apart, but -3% < 5%
    assert judge([100, 101, 99], [97, 98, 96], threshold_pct=2).verdict == "slower"


def test_a_single_sample_is_judged_by_the_threshold_and_said_to_be_one():
    v = judge([100], [80, 81, 79])
    assert (v.verdict, v.single_sample, v.p_value) == ("slower", True, None)
    assert judge([100], [98]).verdict == "same"


def test_for_a_lower_is_better_metric_a_rise_is_worse():
    v = judge([10, 10.1, 9.9], [12, 12.1, 11.9], higher_is_better=False)
    assert (v.verdict, v.change_pct) == ("slower", pytest.approx(-20.0))


def record(**fields):
    return model_of(fields).model_validate(fields)


def run_record(tokens_per_s, **over):
    fields = {"kind": "run", "workload": "gpt2", "status": "ok", "size": "tiny", "world_size": 2, "zero_stage": 2,
              "precision": "bf16", "micro_batch": 4, "grad_accum": 1, "config": {"seq_len": 128},
              "metrics": {"samples_per_s": tokens_per_s / 128, "tokens_per_s": tokens_per_s}}
    return record(**{**fields, **over})


def test_runs_match_on_workload_layout_and_ranks_and_repeats_gather():
    got = samples([run_record(1000), run_record(1010), run_record(900, zero_stage=3), run_record(5, status="failed"),
                   run_record(800, world_size=4)])
    assert sorted(len(s.values) for s in got.values()) == [1, 1, 2]
    (two,) = (s for s in got.values() if len(s.values) == 2)
    assert two.values == [1000, 1010] and (two.metric, two.unit) == ("throughput", "tokens/s")
    assert "z2 off=none bf16 mbs=4" in two.label and "x2" in two.label


def test_runs_match_on_the_layout_key_and_an_old_record_pools_with_a_new_one_of_its_layout():
    """A record written before records carried their layout is read with it (from its config and DeepSpeed
    config), so it pools with a new one of the same layout; a degree the key names keeps runs apart."""
    ds = {"zero_optimization": {"stage": 1}, "bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 1}
    old = run_record(1000, config={"seq_len": 128, "tensor_parallel": 2}, ds_config=ds)
    new = run_record(1010, config={"seq_len": 128, "tensor_parallel": 2}, ds_config=ds,
                     layout=old.layout, layout_key=old.layout_key)
    apart = run_record(900, config={"seq_len": 128}, ds_config=ds)
    assert old.layout_key == "tp2 z1 off=none bf16 mbs=4" and apart.layout_key == "z1 off=none bf16 mbs=4"
    got = samples([old, new, apart])
    assert sorted(len(s.values) for s in got.values()) == [1, 2]


def test_comm_rows_match_on_collective_size_and_ranks():
    comm = record(kind="comm", status="ok", world_size=2, results=[
        {"collective": "all_reduce", "size_bytes": 2**20, "busbw_GBps": 3.0},
        {"collective": "all_reduce", "size_bytes": 2**30, "busbw_GBps": 5.0},
        {"collective": "all_gather", "size_bytes": 2**20, "busbw_GBps": 2.0, "wrong": ["rank 1: mismatch"]}])
    got = samples([comm, comm])
    assert sorted(s.label for s in got.values()) == ["comm all_reduce world 1 GiB 2 ranks",
                                                     "comm all_reduce world 1 MiB 2 ranks"]
    assert all(s.values in ([3.0, 3.0], [5.0, 5.0]) and s.unit == "GB/s" for s in got.values())


def write(path, recs):
    path.write_text("".join(json.dumps(r.model_dump(mode="json", exclude_none=True)) + "\n" for r in recs))
    return str(path)


def test_the_command_exits_1_on_a_slower_match_and_0_when_the_same(tmp_path, capsys):
    """In-process (``ds_bench.cli.main``); the bad-input cases are in ``tests/test_bad_inputs.py``."""
    base = write(tmp_path / "base.jsonl", [run_record(v) for v in (1000, 1010, 990)])
    slow = write(tmp_path / "slow.jsonl", [run_record(v) for v in (700, 710, 690)])
    same = write(tmp_path / "same.jsonl", [run_record(v) for v in (1005, 995, 1000)])
    assert cli.main(["compare", base, slow]) == 1
    out = capsys.readouterr().out
    assert "slower" in out and "-30.0%" in out and "1 match(es), 1 slower" in out, out
    assert cli.main(["compare", base, same]) == 0
    out = capsys.readouterr().out
    assert "same" in out and "0 slower" in out, out


@pytest.mark.full
@pytest.mark.solo  # asserts this machine's figures: no other test's runs beside it
def test_a_real_slowdown_is_caught_and_healthy_runs_are_called_the_same(tmp_path):
    """MNIST on one CPU rank pinned to core 0 (``taskset``, 1 thread), 3 runs per file; the slow file's runs share
    core 0 with a noisy neighbour (a busy loop pinned there: about half the core, as on a shared node). The runs
    interleave, as a careful user measures on a shared machine: each file's runs span the same stretch of the
    machine's time, and the order turns each round (base healthy slow, healthy slow base, slow base healthy) so that
    no file always runs first or always follows the neighbour. Earlier versions slowed the runs by 1 intra-op thread instead of 2:
    while another xdist worker loaded both cores (a JIT op build beside it), the 1-thread runs were the faster
    (481 against 387 samples/s), since 2 threads on 2 busy cores wait for each other; a neighbour on the run's own
    core slows it whatever the other core does. The threshold is 25%: the neighbour halves the slow runs (-50%),
    while healthy runs alone on the machine still came out +16.7% against base once (CI, 2026-11-29: 909-929
    against 1007-1142 images/s, p 0.05), with the threshold at 15% and a fixed order. Measured: see the print
    (``pytest -s``) and docs/commands/report.md."""
    neighbours = {"base": False, "healthy": False, "slow": True}
    paths = {name: tmp_path / f"{name}.jsonl" for name in neighbours}
    names = list(paths)
    for round_ in range(3):
        for name in names[round_:] + names[:round_]:
            path = paths[name]
            with noisy_neighbour(core=0, on=neighbours[name]):
                proc = run_cmd(["taskset", "-c", "0", sys.executable, "-m", "ds_bench", "run", "--workload", "mnist",
                                "--ds-config", "ds_configs/zero1.json", "--set", "bf16.enabled=false",
                                "--micro-batch", "256", "--steps", "25", "--warmup", "5", "--results", str(path)],
                               OMP_NUM_THREADS="1")
            assert proc.returncode == 0, explain(proc)
    assert all(len(records(path)) == 3 for path in paths.values())
    print({name: [round(r["metrics"]["samples_per_s"], 1) for r in records(path)] for name, path in paths.items()})
    base, healthy, slow = (str(paths[name]) for name in ("base", "healthy", "slow"))
    same = ds_bench("compare", base, healthy, "--threshold", "25")
    print(same.stdout)
    assert same.returncode == 0 and "same" in same.stdout, explain(same)
    slower = ds_bench("compare", base, slow, "--threshold", "25")
    print(slower.stdout)
    assert slower.returncode == 1 and "slower" in slower.stdout and "(single sample)" not in slower.stdout, explain(slower)


@contextlib.contextmanager
def noisy_neighbour(core: int, on: bool):
    """A busy loop pinned to ``core`` while the block runs (nothing when not ``on``); killed and reaped after."""
    if not on:
        yield
        return
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    try:
        yield
    finally:
        hog.kill()
        hog.wait(timeout=30)
