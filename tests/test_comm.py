"""ds-bench comm: bandwidth formulas and known-result patterns on exact numbers (pure), the gate,
and real 2-rank runs under torchrun and mpirun (records, correctness failure, --expect-busbw)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from ds_bench.comm import bandwidth, patterns, table
from ds_bench.comm.spec import parse_expectations
from ds_bench.errors import UserError
from tests.conftest import BIN, explain, run_cmd

N = 4


# bandwidth (nccl-tests doc/PERFORMANCE.md)

def test_bus_factors_follow_nccl_tests():
    assert bandwidth.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bandwidth.bus_factor("all_gather", 8) == bandwidth.bus_factor("reduce_scatter", 8) == pytest.approx(0.875)
    assert bandwidth.bus_factor("all_to_all", 2) == pytest.approx(0.5)
    assert bandwidth.bus_factor("broadcast", 8) == bandwidth.bus_factor("send_recv", 2) == 1.0
    with pytest.raises(ValueError, match="unknown collective 'gather'"):
        bandwidth.bus_factor("gather", 2)


def test_algbw_and_busbw_in_decimal_gigabytes_per_second():
    # 1 GiB all_reduce in 0.1 s over 8 ranks: algbw 10.737 GB/s, busbw x 1.75
    assert bandwidth.algbw_gbps(2**30, 0.1) == pytest.approx(10.737418)
    assert bandwidth.busbw_gbps("all_reduce", 8, 2**30, 0.1) == pytest.approx(10.737418 * 1.75)


def test_sizes_double_and_include_the_maximum():
    assert bandwidth.sizes(8, 64, 2) == [8, 16, 32, 64]
    assert bandwidth.sizes(1024, 5000, 4) == [1024, 4096]
    assert bandwidth.sizes(8, 8, 2) == [8]


def test_split_collectives_round_counts_to_a_multiple_of_the_ranks():
    assert bandwidth.element_count("all_gather", 40, 3, 4) == 9      # 10 floats -> 9
    assert bandwidth.element_count("all_reduce", 40, 3, 4) == 10
    assert bandwidth.element_count("reduce_scatter", 4, 4, 4) == 4   # one float, but one per rank
    assert bandwidth.element_count("broadcast", 2, 4, 4) == 1


# patterns: each expected result follows from the collective's definition, simulated here

def inputs(collective, count, n=N):
    return [patterns.make_input(collective, r, n, count, torch.float32, "cpu").double() for r in range(n)]


def simulate(collective: str, count: int, rank: int, n: int = N) -> torch.Tensor:
    x = inputs(collective, count, n)
    chunk = count // n
    if collective == "all_reduce":
        return sum(x)
    if collective == "all_gather":
        return torch.cat(x)
    if collective == "reduce_scatter":
        return sum(x)[rank * chunk:(rank + 1) * chunk]
    if collective == "broadcast":
        return x[0]
    if collective == "all_to_all":
        return torch.cat([x[s][rank * chunk:(rank + 1) * chunk] for s in range(n)])
    return x[(rank - 1) % n]  # send_recv ring


@pytest.mark.parametrize("collective", bandwidth.COLLECTIVES)
def test_expected_results_match_the_definitions(collective):
    count = 4 * 13 * N
    for rank in range(N):
        want = patterns.expected(collective, rank, N, count, torch.float32)
        assert torch.equal(simulate(collective, count, rank), want), (collective, rank)
        assert patterns.first_mismatch(simulate(collective, count, rank).float(), want, torch.float32) is None


def test_sums_stay_exact_in_bf16_at_eight_ranks():
    want = patterns.expected("all_reduce", 0, 8, 64, torch.bfloat16)
    assert want.max() <= 256 and torch.equal(want.to(torch.bfloat16).double(), want)


def test_a_corrupted_contribution_is_found_and_named(monkeypatch):
    monkeypatch.setenv(patterns.CORRUPT_ENV, "2")
    count = 2 * N
    got = simulate("all_gather", count, rank=0)
    want = patterns.expected("all_gather", 0, N, count, torch.float32)
    index = patterns.first_mismatch(got, want, torch.float32)
    assert index == 4  # rank 2's chunk starts at 2 x (count / N)
    line = patterns.describe_mismatch("all_gather", 32, 0, N, count, index, float(got[index]), float(want[index]))
    assert line == "all_gather of 32 B: rank 0 got 3 instead of 2 at element 4 (the chunk from rank 2)"


# report and gate on inline samples

def s(collective, size, seconds, wrong=None):
    return {"collective": collective, "size_bytes": size, "count": size // 4, "seconds": seconds, "wrong": wrong}


def test_rows_average_over_ranks_and_keep_the_spread():
    per_rank = [[s("all_reduce", 10**9, 0.5)], [s("all_reduce", 10**9, 1.5, wrong="rank 1 got 3")]]
    (row,) = table.rows(per_rank, 2)
    assert row["time_us"] == pytest.approx(1e6) and row["time_us_median"] == pytest.approx(1e6)
    assert (row["time_us_min"], row["time_us_max"]) == (pytest.approx(5e5), pytest.approx(1.5e6))
    assert row["algbw_GBps"] == pytest.approx(1.0) and row["busbw_GBps"] == pytest.approx(1.0)  # 2(n-1)/n = 1
    assert row["wrong"] == ["rank 1 got 3"] and table.wrong_results([row]) == ["rank 1 got 3"]


def test_the_gate_reads_the_largest_message_of_each_collective():
    per_rank = [[s("all_reduce", 2**20, 1e-3), s("all_reduce", 2**30, 1.0), s("all_gather", 2**30, 0.1)]]
    rows = table.rows(per_rank * 2, 2)
    assert table.gate(rows, {"all_reduce": 1.0}) == []  # 1.07 GB/s meets 1
    assert table.gate(rows, {"all_reduce": 2.0}) == [
        "all_reduce busbw 1.07 GB/s at 1 GiB is below the expected 2 GB/s (--expect-busbw)"]
    assert table.gate(rows, {"all_gather": 6.0}) == [
        "all_gather busbw 5.37 GB/s at 1 GiB is below the expected 6 GB/s (--expect-busbw)"]


def test_expectations_parse_bare_and_per_collective():
    assert parse_expectations(["25", "all_gather=12.5"], ("all_reduce", "all_gather")) == {
        "all_reduce": 25.0, "all_gather": 12.5}
    with pytest.raises(UserError, match="all_reduce is not among the measured"):
        parse_expectations(["25"], ("broadcast",))


# real ranks

def comm_argv(tmp_path, *extra):
    return ["-m", "ds_bench", "comm", "--max-bytes", "64KiB", "--min-bytes", "1KiB", "--step-factor", "8",
            "--iters", "3", "--warmup", "1", "--results", str(tmp_path / "c.jsonl"), "--iface", "lo", *extra]


def comm_record(tmp_path) -> dict:
    (record,) = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    return record


@pytest.mark.dist
def test_comm_under_torchrun_records_every_collective_and_passes_a_trivial_gate(tmp_path):
    proc = run_cmd([str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", "29781",
                    *comm_argv(tmp_path, "--expect-busbw", "1e-6", "--expect-busbw", "all_to_all=1e-6")], timeout=180)
    assert proc.returncode == 0, explain(proc)
    r = comm_record(tmp_path)
    assert r["kind"] == "comm" and r["status"] == "ok" and r["problems"] == [] and r["world_size"] == 2
    assert r["backend"] == "gloo" and r["launcher"] == "torchrun" and len(r["hosts"]) == 2
    assert r["env"]["GLOO_SOCKET_IFNAME"] == "lo" and r["versions"]["deepspeed"]
    got = {(row["collective"], row["size_bytes"]) for row in r["results"]}
    assert got == {(c, size) for c in bandwidth.COLLECTIVES for size in (1024, 8192, 65536)}
    assert all(row["busbw_GBps"] > 0 and row["wrong"] == [] for row in r["results"])
    assert "busbw GB/s" in proc.stdout and "GB/s = 1e9 B/s" in proc.stdout
    assert (tmp_path / "c_busbw.png").stat().st_size > 10_000


@pytest.mark.dist
def test_a_wrong_contribution_and_an_impossible_gate_fail_the_run_by_name(tmp_path):
    proc = run_cmd([str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", "29782",
                    *comm_argv(tmp_path, "--collectives", "all_gather,broadcast", "--expect-busbw",
                               "broadcast=1e6")], timeout=180, DS_BENCH_COMM_CORRUPT="1")
    assert proc.returncode == 1, explain(proc)
    r = comm_record(tmp_path)
    assert r["status"] == "failed"
    assert "all_gather of 1024 B: rank 0 got 9 instead of 8 at element 128 (the chunk from rank 1)" in r["problems"]
    assert not any(p.startswith("broadcast of") for p in r["problems"])  # rank 1 does not send in a broadcast
    (gate,) = [p for p in r["problems"] if "--expect-busbw" in p]
    assert gate.startswith("broadcast busbw ") and "at 64 KiB is below the expected 1e+06 GB/s" in gate
    assert f"PROBLEM: {gate}" in proc.stdout


@pytest.mark.dist
@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI's mpirun is not installed")
def test_comm_under_mpirun_discovers_ranks_and_measures(tmp_path):
    proc = run_cmd(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", str(BIN / "python"),
                    *comm_argv(tmp_path, "--collectives", "all_reduce,send_recv")], timeout=180)
    assert proc.returncode == 0, explain(proc)
    r = comm_record(tmp_path)
    assert r["launcher"] == "openmpi" and r["rendezvous"]["master_addr"], r["launcher"]
    assert r["status"] == "ok" and {row["collective"] for row in r["results"]} == {"all_reduce", "send_recv"}
    assert all(row["busbw_GBps"] > 0 for row in r["results"])


def test_link_groups_split_hosts_into_intra_and_inter():
    from ds_bench.comm.topology import LinkGroup, link_groups

    assert link_groups(["a", "a"]) == []
    assert link_groups(["a", "a", "b", "b", "c"]) == [
        LinkGroup("intra-host", "a", (0, 1)), LinkGroup("intra-host", "b", (2, 3)),
        LinkGroup("inter-host", "one rank per host", (0, 2, 4))]
    assert link_groups(["a", "b"]) == [LinkGroup("inter-host", "one rank per host", (0, 1))]


def test_one_rank_is_said_to_measure_no_link(tmp_path):
    """One process, torch's env:// rendezvous variables: the check runs, and the note says why busbw is 0."""
    proc = run_cmd([str(BIN / "python"), *comm_argv(tmp_path, "--collectives", "all_reduce,send_recv", "--pairs")],
                   timeout=120, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29783")
    assert proc.returncode == 0, explain(proc)
    r = comm_record(tmp_path)
    assert r["note"].startswith("1 rank: no data crosses a link") and "NOTE: 1 rank" in proc.stdout
    assert {row["collective"] for row in r["results"]} == {"all_reduce"}  # send_recv needs a peer
    assert all(row["busbw_GBps"] == 0 and not row["wrong"] for row in r["results"])
    assert "pairs: one host, no host pairs to measure" in proc.stdout
    assert (r["slow_links"], r["suspect_hosts"]) == ([], [])


# --pairs: the schedule and the verdict (pure)

@pytest.mark.parametrize("n_hosts", [1, 2, 3, 4, 7, 8])
def test_pair_rounds_cover_every_pair_once_with_no_host_twice_in_a_round(n_hosts):
    from ds_bench.comm.pairs import pair_rounds

    hosts = [f"h{i}" for i in range(n_hosts)]
    rounds = pair_rounds(hosts)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == sorted((a, b) for i, a in enumerate(hosts) for b in hosts[i + 1:])
    assert all(len({h for p in r for h in p}) == 2 * len(r) for r in rounds)
    assert len(rounds) == (0 if n_hosts < 2 else n_hosts - 1 if n_hosts % 2 == 0 else n_hosts)


def test_leaders_are_each_hosts_first_rank():
    from ds_bench.comm.pairs import leaders

    assert leaders(["b", "b", "a", "c", "a"]) == {"b": 0, "a": 2, "c": 3}


def pair_row(link, size, busbw):
    return {"scope": "pair", "group": link, "collective": "send_recv", "size_bytes": size, "busbw_GBps": busbw}


def test_slow_links_are_judged_against_the_best_link_at_the_largest_size():
    from ds_bench.comm.pairs import describe, slow_links, suspect_hosts

    rows = [pair_row("a<->b", 2**20, 0.1), pair_row("a<->b", 2**22, 10.0),  # small sizes are not judged
            pair_row("a<->c", 2**22, 2.0), pair_row("b<->c", 2**22, 2.5), pair_row("a<->d", 2**22, 9.0),
            pair_row("b<->d", 2**22, 7.6), pair_row("c<->d", 2**22, 1.0)]
    slow = slow_links(rows, 25.0)
    assert [s["link"] for s in slow] == ["c<->d", "a<->c", "b<->c"]  # b<->d at -24% is within 25%
    assert slow[0]["vs_best_pct"] == pytest.approx(-90.0)
    assert suspect_hosts(rows, slow) == ["c"]
    lines = describe(rows, slow, ["c"], 25.0)
    assert lines[0] == "pairs: 6 links; best a<->b 10 GB/s busbw at 4 MiB"
    assert lines[1].startswith("  c<->d: 1 GB/s (-90% vs best) SLOW") and lines[-1].startswith("  suspect host c:")
    assert slow_links([pair_row("a<->b", 2**22, 1.0)], 25.0) == []  # one link: nothing to compare


def test_pair_rows_average_the_two_ends_of_each_link():
    from ds_bench.comm.pairs import rows

    everyone = [[("a<->b", s("send_recv", 10**9, 1.0))], [("a<->b", s("send_recv", 10**9, 3.0))], []]
    (row,) = rows(everyone)
    assert (row["scope"], row["group"], row["busbw_GBps"]) == ("pair", "a<->b", pytest.approx(0.5))


# comm-bound verdict (pure; the real 2-rank runs are in test_distributed and test_slow_ranks)

def test_bus_bytes_per_step_follow_the_zero_paper_volumes():
    from ds_bench.perf.bus_bytes import bus_bytes_per_step

    psi, n = 1000, 4  # (n-1)/n = 0.75
    assert bus_bytes_per_step(0, psi, 2, 2, n, 1) == {"all_reduce": 2 * 0.75 * psi * 2}
    assert bus_bytes_per_step(1, psi, 2, 4, n, 8) == {"reduce_scatter": 0.75 * psi * 4, "all_gather": 0.75 * psi * 2}
    assert bus_bytes_per_step(2, psi, 2, 2, n, 8) == {"reduce_scatter": 0.75 * 8 * psi * 2, "all_gather": 0.75 * psi * 2}
    three = bus_bytes_per_step(3, psi, 2, 2, n, 1)
    assert three == {"reduce_scatter": 0.75 * psi * 2, "all_gather": 0.75 * 2 * psi * 2}
    assert sum(three.values()) == 1.5 * sum(bus_bytes_per_step(0, psi, 2, 2, n, 1).values())  # ZeRO paper: 1.5x DP


def test_tensor_parallelism_adds_the_groups_activation_all_reduces():
    """Llama 3.1 8B shape, 8 ranks as TP 2 x DP 4, bf16 ZeRO-1, micro-batch 1 x 4096 tokens, 2 micro-steps:
    the DP collectives move the rank's half of Psi over 4 ranks; each micro-step all-reduces 4 x 32 blocks x
    4096 x 4096 bf16 elements in its 2-rank group, 2(2-1)/2 = 1 x the bytes."""
    from ds_bench.perf.bus_bytes import bus_bytes_per_step, tensor_parallel_bus_bytes
    from ds_bench.perf.comm_bound import for_run

    psi, elements = 8_030_261_248, 4 * 32 * 4096 * 4096
    assert tensor_parallel_bus_bytes(2, elements, 2, 2) == elements * 2 * 2
    assert tensor_parallel_bus_bytes(4, elements, 2, 1) == 1.5 * elements * 2
    entry = for_run(stage=1, precision="bf16", ds_cfg={}, params=psi, world_size=8, micro_steps=2, step_ms=1e4,
                    hosts=["n"] * 8, backend="nccl", busbw=100.0, comm_results="-", tensor_parallel=2,
                    tp_all_reduce_elements=elements)
    data_parallel = bus_bytes_per_step(1, psi // 2, 2, 2, 4, 2)
    assert entry["bus_bytes_per_step"] == {**data_parallel, "tp_all_reduce": elements * 2 * 2}
    assert entry["busbw_GBps"]["tp_all_reduce"] == 100.0
    alone = for_run(stage=1, precision="bf16", ds_cfg={}, params=psi, world_size=2, micro_steps=1, step_ms=1e4,
                    hosts=["n"] * 2, backend="nccl", busbw=100.0, comm_results="-", tensor_parallel=2,
                    tp_all_reduce_elements=elements)
    assert set(alone["bus_bytes_per_step"]) == {"tp_all_reduce"}  # one replica: no data-parallel traffic


def test_gradient_bytes_follow_communication_data_type():
    from ds_bench.perf.bus_bytes import grad_bytes_of

    assert grad_bytes_of({}, "bf16") == 2 and grad_bytes_of({}, "fp32") == 4
    assert grad_bytes_of({"communication_data_type": "fp32"}, "bf16") == 4


def test_judge_times_each_collective_at_its_busbw_and_falls_back_to_all_reduce():
    from ds_bench.perf.comm_bound import judge
    from ds_bench.report.comm_bound import describe

    moved = {"reduce_scatter": 2e9, "all_gather": 1e9}
    entry = judge(moved, {"all_reduce": 1.0, "reduce_scatter": 2.0}, "comm run x", step_ms=4000.0)
    assert entry["busbw_GBps"] == {"reduce_scatter": 2.0, "all_gather": 1.0}
    assert entry["comm_ms_lower_bound"] == pytest.approx(2000.0)  # 2e9/2e9 + 1e9/1e9 s
    assert entry["fraction_of_step"] == pytest.approx(0.5) and entry["communication_bound"] is True
    assert judge(moved, {"all_reduce": 1.0}, "--busbw", step_ms=4001.0)["communication_bound"] is True
    assert judge(moved, {"all_reduce": 1.0}, "--busbw", step_ms=6001.0)["communication_bound"] is False
    assert describe(entry) == (">= 2,000 ms of the 4,000 ms step (50%): reduce_scatter 2,000 MB + all_gather "
                               "1,000 MB per rank at busbw reduce_scatter 2 GB/s, all_gather 1 GB/s (comm run x); "
                               "communication-bound")
    assert judge(moved, {"broadcast": 1.0}, "comm run y", 1.0)["note"].startswith("no busbw for reduce_scatter")


def test_the_newest_ok_comm_record_of_the_same_ranks_is_used(tmp_path):
    from ds_bench.perf.comm_bound import busbw_from_comm_record, latest_comm_record

    def rec(run_id, busbw, **over):
        base = {"kind": "comm", "status": "ok", "world_size": 2, "backend": "gloo", "hosts": ["n1", "n1"],
                "run_id": run_id, "results": [
                    {"scope": "world", "collective": "all_reduce", "size_bytes": 2**20, "busbw_GBps": busbw / 2, "wrong": []},
                    {"scope": "world", "collective": "all_reduce", "size_bytes": 2**22, "busbw_GBps": busbw, "wrong": []},
                    {"scope": "pair", "group": "a<->b", "collective": "send_recv", "size_bytes": 2**23, "busbw_GBps": 9.0,
                     "wrong": []}]}
        return json.dumps({**base, **over})

    path = tmp_path / "comm.jsonl"
    path.write_text("\n".join([rec("old", 1.0), rec("new", 2.0), "not json", rec("failed", 3.0, status="failed"),
                               rec("wide", 4.0, world_size=4), rec("nccl", 5.0, backend="nccl"),
                               rec("elsewhere", 6.0, hosts=["n2", "n2"]), json.dumps({"kind": "run"})]) + "\n")
    found = latest_comm_record(str(path), ["n1"], 2, "gloo")
    assert found.run_id == "new" and busbw_from_comm_record(found) == {"all_reduce": 2.0}
    assert latest_comm_record(str(tmp_path / "none.jsonl"), ["n1"], 2, "gloo") is None
