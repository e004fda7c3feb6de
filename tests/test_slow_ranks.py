"""Slow-rank detection: the rule on inline inputs, and real 2-rank CPU runs, one with rank 1 held to
20% of a core by a kernel CPU quota (a cgroup; real throttling, not a faked number)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from ds_bench.measure import slow_ranks
from ds_bench.measure.loop import DeviceClock
from ds_bench.record.schema import RunRecord
from ds_bench.report.summary import one_run
from tests.conftest import BIN, REPO, child_env, explain, records, run_cmd

# --- the rule --------------------------------------------------------------------------------------


def names(found):
    return [(rank, host) for rank, host, *_ in found]


def test_one_rank_is_its_own_median_and_never_slow():
    assert slow_ranks.find([(0, "a", 250.0)], 10) == []


def test_two_ranks_compare_with_their_mean():
    ((rank, host, compute_ms, vs_median_pct),) = slow_ranks.find([(0, "a", 100.0), (1, "b", 200.0)], 10)
    assert (rank, host, compute_ms) == (1, "b", 200.0)
    assert vs_median_pct == pytest.approx(100 * (200 / 150 - 1))  # 33%: the median of two is their mean
    assert slow_ranks.find([(0, "a", 100.0), (1, "b", 200.0)], 34) == []


def test_names_every_rank_above_the_threshold_in_rank_order():
    per_rank = [(3, "b", 130.0), (0, "a", 100.0), (1, "a", 101.0), (2, "b", 99.0), (4, "c", 100.0)]
    found = slow_ranks.find(per_rank, 10)
    assert names(found) == [(3, "b")] and found[0][3] == pytest.approx(30.0)
    per_rank.append((5, "c", 120.0))  # median of six: (100 + 101) / 2
    assert names(slow_ranks.find(per_rank, 10)) == [(3, "b"), (5, "c")]


def test_tied_ranks_are_all_named_or_none():
    assert names(slow_ranks.find([(0, "a", 100.0), (1, "a", 150.0), (2, "b", 150.0), (3, "b", 100.0),
                                  (4, "c", 100.0)], 10)) == [(1, "a"), (2, "b")]
    assert slow_ranks.find([(0, "a", 80.0), (1, "b", 80.0), (2, "c", 80.0)], 10) == []


def test_exactly_at_the_threshold_is_not_slow():
    per_rank = [(0, "a", 100.0), (1, "a", 100.0), (2, "a", 125.0)]
    assert slow_ranks.find(per_rank, 25) == []
    assert names(slow_ranks.find(per_rank, 24.9)) == [(2, "a")]


def test_nothing_measured_names_nobody():
    assert slow_ranks.find([], 10) == []
    assert slow_ranks.find([(0, "a", 0.0), (1, "a", 0.0), (2, "a", 5.0)], 10) == []  # median 0: no basis
    assert slow_ranks.from_metrics({}, 10) == []


def test_record_entries_and_the_summary_line():
    metrics = {"compute_ms_per_rank": [50.0, 80.0, 50.0], "host_per_rank": ["n1", "n1", "n2"]}
    slow = slow_ranks.from_metrics(metrics, 10)
    assert slow == [{"rank": 1, "host": "n1", "compute_ms": 80.0, "vs_median_pct": pytest.approx(60.0)}]
    record = {"workload": "mnist", "zero_stage": 1, "precision": "fp32", "world_size": 3, "launcher": "torchrun",
              "hardware": {"device_type": "cpu"}, "micro_batch": 8, "grad_accum": 1, "train_batch_size": 24,
              "run_id": "x", "config": {"slow_rank_threshold": 10.0}, "slow_ranks": slow,
              "metrics": {**metrics, "samples_per_s": 1.0, "samples_per_s_per_device": 0.3, "step_ms_median": 1.0,
                          "step_ms_p90": 1.0, "steps_measured": 3, "breakdown_ms_median": {}, "peak_mem_bytes": 0,
                          "peak_mem_kind": "rss", "loss_first": 1.0, "loss_last": 1.0}}
    text = one_run(RunRecord.model_validate(record), "r.jsonl")
    assert "slow rank    rank 1 on n1: compute 80.0 ms, 60% slower than the median rank (threshold 10%)" in text
    assert "slow rank" not in one_run(RunRecord.model_validate({**record, "slow_ranks": []}), "r.jsonl")


def test_compute_time_ends_with_autograd_not_with_what_follows_backward():
    """What DeepSpeed runs after autograd (the gradient reduction, where fast ranks wait) is not compute."""
    clock = DeviceClock(torch.device("cpu"))
    w = torch.ones(200, 200, requires_grad=True)
    start = clock.mark()
    loss = (w @ w).sum()
    end = clock.mark_autograd_end(loss)
    assert end == []  # filled in by the backward, not before
    loss.backward()
    time.sleep(0.3)  # stands in for the reduction epilogue inside engine.backward
    assert 0 < clock.seconds(start, end) < 0.3
    assert clock.seconds(start, clock.mark_autograd_end(loss.detach())) == 0.0  # no backward: nothing measured


# --- real 2-rank runs -------------------------------------------------------------------------------

RUN = ["run", "--workload", "mnist", "--ds-config", "ds_configs/zero1.json", "--set", "bf16.enabled=false",
       "--micro-batch", "32", "--steps", "30", "--warmup", "5"]
TIMEOUT_S = 90


def start_ranks(tmp_path, port: int, *extra: str) -> tuple[subprocess.Popen, object]:
    log = open(tmp_path / "out.log", "w")
    argv = [str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(port), "-m", "ds_bench", *RUN,
            "--results", str(tmp_path / "r.jsonl"), *extra]
    proc = subprocess.Popen(argv, cwd=REPO, env=child_env(OMP_NUM_THREADS="1"), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def rank_pids(proc: subprocess.Popen, deadline: float) -> dict[int, int]:
    """rank -> pid of both ranks, as soon as torchrun has started them."""
    while time.monotonic() < deadline and proc.poll() is None:
        found = {}
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                rank = p.environ().get("RANK")
            except psutil.Error:
                continue
            if rank in ("0", "1"):
                found[int(rank)] = p.pid
        if len(found) == 2:
            return found
        time.sleep(0.05)
    raise AssertionError("the two ranks were not found")


def wait_for(proc: subprocess.Popen, log: Path, text: str, deadline: float) -> None:
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {text!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in time:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def finish(proc: subprocess.Popen, log, tmp_path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
    out = (tmp_path / "out.log").read_text()
    return subprocess.CompletedProcess(proc.args, code, out, ""), records(tmp_path / "r.jsonl")


QUOTA = (4000, 20000)
"""Rank 1's CPU quota: 4 ms of CPU time per 20 ms period, 20% of one core, enforced by the kernel.
A quota is absolute, unlike busy loops sharing rank 1's core: on this shared 2-core machine other
(unpinned) work then migrated to rank 0's less loaded core, and rank 0 came out the slower one."""


class CpuQuota:
    """A cgroup (v1 ``cpu`` controller, or v2 with ``cpu`` enabled) capping the processes moved in."""

    def __init__(self, name: str):
        v1, v2 = Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup")
        v2_controllers = v2 / "cgroup.subtree_control"
        if (v1 / "cpu.cfs_quota_us").exists():
            self.path, self.v2 = v1 / name, False
        elif v2_controllers.exists() and "cpu" in v2_controllers.read_text().split():
            self.path, self.v2 = v2 / name, True
        else:
            pytest.skip("no writable cgroup cpu controller to give rank 1 a CPU quota")
        try:
            self.path.mkdir()
        except OSError as e:
            pytest.skip(f"cannot create a cgroup for rank 1's CPU quota: {e}")
        quota, period = QUOTA
        if self.v2:
            (self.path / "cpu.max").write_text(f"{quota} {period}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))  # every thread, and those it starts later

    def remove(self, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.path.rmdir()  # fails while a process is still inside
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@pytest.mark.dist
def test_a_rank_under_a_cpu_quota_is_named_slow(tmp_path, fashion_mnist):
    started = time.monotonic()
    quota = CpuQuota(f"ds_bench_slow_rank_{os.getpid()}")
    proc = log = None
    try:
        proc, log = start_ranks(tmp_path, 29851, "--data", str(fashion_mnist), "--steps", "25", "--warmup", "3")
        rank1 = rank_pids(proc, started + 60)[1]
        wait_for(proc, tmp_path / "out.log", "warm-up done", started + TIMEOUT_S)
        quota.add(rank1)  # from here: start-up at full speed keeps the test short; a step or two of the
        done, recs = finish(proc, log, tmp_path)  # measured window may run before it (medians)
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        if log is not None:
            log.close()
        quota.remove()
    assert done.returncode == 0, explain(done)
    (r,) = recs
    compute = r["metrics"]["compute_ms_per_rank"]
    print(f"compute ms per rank {compute}, slow {r['slow_ranks']}, {time.monotonic() - started:.1f} s")
    assert [s["rank"] for s in r["slow_ranks"]] == [1], (compute, r["slow_ranks"])
    (slow,) = r["slow_ranks"]
    assert slow["host"] == r["metrics"]["host_per_rank"][1] == r["host"]  # one machine: the record's host
    assert slow["compute_ms"] == compute[1] and slow["vs_median_pct"] > 10
    assert f"slow rank    rank 1 on {slow['host']}: compute" in done.stdout


@pytest.mark.dist
@pytest.mark.full
def test_a_normal_run_with_a_high_threshold_names_nobody(tmp_path, fashion_mnist):
    started = time.monotonic()
    comm = run_cmd([str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", "29854", "-m", "ds_bench", "comm",
                    "--collectives", "all_reduce,reduce_scatter,all_gather", "--min-bytes", "1MiB", "--max-bytes",
                    "4MiB", "--iters", "5", "--results", str(tmp_path / "comm.jsonl")], timeout=TIMEOUT_S)
    assert comm.returncode == 0, explain(comm)
    (comm_record,) = records(tmp_path / "comm.jsonl")
    proc, log = start_ranks(tmp_path, 29852, "--data", str(fashion_mnist), "--slow-rank-threshold", "50",
                            "--comm-results", str(tmp_path / "comm.jsonl"))
    done, recs = finish(proc, log, tmp_path)
    assert done.returncode == 0, explain(done)
    (r,) = recs
    # the comm-bound verdict took its busbw from the comm run on the same two ranks
    entry = r["comm_bound"]
    assert entry["busbw_source"] == f"comm run {comm_record['run_id']} of {comm_record['time']}"
    largest = {row["collective"]: row["busbw_GBps"] for row in comm_record["results"] if row["size_bytes"] == 4 * 2**20}
    assert entry["busbw_GBps"] == {c: largest[c] for c in ("reduce_scatter", "all_gather")}  # ZeRO-1's collectives
    assert entry["communication_bound"] is False and 0 < entry["fraction_of_step"] < 0.5  # 0.1M params over shm
    assert "; not communication-bound" in done.stdout
    compute = r["metrics"]["compute_ms_per_rank"]
    print(f"compute ms per rank {compute}, {time.monotonic() - started:.1f} s")
    assert len(compute) == 2 and all(ms > 0 for ms in compute)
    assert r["slow_ranks"] == [] and r["config"]["slow_rank_threshold"] == 50
    assert "slow rank" not in done.stdout
