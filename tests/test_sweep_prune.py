"""``sweep --prune-predicted``: the plan record a sweep may use, the ranking and its reasons (``sweep.prune``, pure,
on inline inputs), ``Cluster``'s record round trip, and a ``--dry-run`` sweep saying which points it prunes. Nothing
here launches a job."""

from __future__ import annotations

from pathlib import Path

import pytest

from ds_bench import cli
from ds_bench.config.layout import Layout
from ds_bench.errors import UserError
from ds_bench.perf import shapes
from ds_bench.perf.datasheet import cluster_of
from ds_bench.perf.devices import Cluster, cpu_cluster
from ds_bench.record import store
from ds_bench.record.plan_schema import PlanRecord
from ds_bench.sweep import prune

GiB = 1024 ** 3
RUN_ID = "20260101T000000-abcdef01"


def cpu_ranks(nodes: int = 1, per_node: int = 2) -> Cluster:
    return cpu_cluster(nodes, per_node, 8 * GiB, 0.5, {"all_reduce": 2.0}, 10.0, None, None)


def plan_record(workload: str = "gpt2", size: str = "tiny", cluster: Cluster | None = None,
                run_id: str = RUN_ID) -> PlanRecord:
    return PlanRecord(kind="plan", status="ok", workload=workload, size=size, params=1, seq_len=128,
                      global_batch_tokens=1024, sequences=8, precision="fp32",
                      cluster=(cluster or cpu_ranks()).to_dict(), run_id=run_id)


def prediction(key: str, tokens: float, mem_gib: float = 1.0, usable_gib: float = 8.0) -> prune.Prediction:
    return prune.Prediction(key, tokens, int(mem_gib * GiB), usable_gib * GiB)


# --- the cluster a plan record holds ---------------------------------------------------------------
@pytest.mark.parametrize("cluster", [cluster_of("H100", 2, 8, "bf16"), cluster_of("V100", 1, 4, "fp16"), cpu_ranks()],
                         ids=["h100 2x8", "v100 1x4", "cpu 1x2"])
def test_a_cluster_survives_its_record(cluster):
    assert Cluster.from_dict(cluster.to_dict()) == cluster
    via_record = PlanRecord.model_validate_json(plan_record(cluster=cluster).model_dump_json())
    assert Cluster.from_dict(via_record.cluster) == cluster


def test_a_record_without_host_bandwidth_takes_the_family_s():
    cluster = cluster_of("V100", 1, 4, "fp16")
    older = {k: v for k, v in cluster.to_dict().items() if k != "host_GBps"}
    assert Cluster.from_dict(older).host_GBps == 12


def test_a_cluster_missing_a_figure_is_named():
    with pytest.raises(ValueError, match="lacks peak_tflops"):
        Cluster.from_dict({k: v for k, v in cpu_ranks().to_dict().items() if k != "peak_tflops"})


# --- which plan ------------------------------------------------------------------------------------
def test_the_newest_matching_plan_is_taken():
    older, newer = plan_record(run_id="a"), plan_record(run_id="c")
    other = plan_record("llama", "llama3.2-1b", run_id="b")
    assert prune.pick_plan([older, newer, other], "gpt2", "tiny", 2, "p.jsonl").run_id == "c"


def test_a_plan_for_another_world_is_refused_naming_what_differs():
    records = [plan_record(cluster=cpu_ranks(2, 4))]
    with pytest.raises(UserError) as e:
        prune.pick_plan(records, "gpt2", "tiny", 2, "p.jsonl")
    assert str(e.value) == (f"--prune-predicted p.jsonl: no plan record for gpt2 tiny on 2 rank(s); the newest, "
                            f"{RUN_ID}, has world size 8 = 2 nodes x 4 (the sweep's 2)")


def test_a_plan_of_another_size_and_no_plan_at_all_are_refused():
    with pytest.raises(UserError, match=r"has size small \(the sweep's tiny\)$"):
        prune.pick_plan([plan_record(size="small")], "gpt2", "tiny", 2, "p.jsonl")
    with pytest.raises(UserError, match=r"^--prune-predicted p\.jsonl: no plan record in it"):
        prune.pick_plan([], "gpt2", "tiny", 2, "p.jsonl")


# --- the ranking -----------------------------------------------------------------------------------
def test_the_best_k_are_kept_and_every_other_point_says_why():
    preds = [prediction("a", 100.0), prediction("b", 456.0), prediction("c", 300.0), prediction("d", 123.0),
             prediction("e", 50.0)]
    pruning = prune.rank(preds, 2, RUN_ID, "p.jsonl")
    assert [p.key for p in pruning.kept] == ["b", "c"]
    assert list(pruning.pruned) == ["d", "a", "e"]
    assert pruning.pruned["d"] == (f"pruned by plan {RUN_ID} (p.jsonl): predicted 123 tokens/s per rank, 3rd of 5; "
                                   "kept the best 2 (best 456)")
    assert "5th of 5" in pruning.pruned["e"] and "predicted 50 tokens/s" in pruning.pruned["e"]


def test_points_predicted_not_to_fit_rank_last_and_ties_go_to_less_memory():
    preds = [prediction("big", 900.0, mem_gib=9.0), prediction("fat", 200.0, mem_gib=3.0),
             prediction("lean", 200.0, mem_gib=2.0)]
    pruning = prune.rank(preds, 1, RUN_ID, "p.jsonl")
    assert [p.key for p in pruning.kept] == ["lean"]
    assert list(pruning.pruned) == ["fat", "big"]
    assert pruning.pruned["big"].endswith("3rd of 3; kept the best 1 (best 200); predicted 9.00 GiB per rank > "
                                          "8.00 GiB usable")


def test_keeping_more_than_the_grid_prunes_nothing():
    pruning = prune.rank([prediction("a", 1.0), prediction("b", 2.0)], 3, RUN_ID, "p.jsonl")
    assert [p.key for p in pruning.kept] == ["b", "a"] and pruning.pruned == {}


@pytest.mark.parametrize("n, word", [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"),
                                     (13, "13th"), (21, "21st"), (112, "112th")])
def test_ordinals(n, word):
    assert prune.ordinal(n) == word


def test_a_point_is_predicted_from_its_micro_batch_accumulation_and_replicas():
    shape = shapes.of_workload("gpt2", "tiny", None, None, None, 128)
    cluster = cpu_ranks()
    one, two = (prune.predict(shape, Layout(1, "none", "fp32", m), 128, cluster, False, 10.0) for m in (1, 2))
    assert one.key == "z1 off=none fp32 mbs=1" and 0 < one.tokens_per_s_per_rank < two.tokens_per_s_per_rank
    assert one.memory_bytes < two.memory_bytes and one.fits
    ckpt = prune.predict(shape, Layout(1, "none", "fp32", 2), 128, cluster, True, 10.0)
    assert ckpt.tokens_per_s_per_rank < two.tokens_per_s_per_rank and ckpt.memory_bytes < two.memory_bytes


# --- a dry-run sweep -------------------------------------------------------------------------------
def sweep_argv(tmp_path: Path, *more: str) -> list[str]:
    return ["sweep", "--workload", "gpt2", "--size", "tiny", "--seq-len", "128", "--ds-config", "zero1.json",
            "--precision", "fp32", "--stages", "0,1,2,3", "--micro-batch", "1,2", "--nproc", "2", "--dry-run",
            "--results", str(tmp_path / "s.jsonl"), "--prune-predicted", str(tmp_path / "plan.jsonl"), *more]


@pytest.mark.parametrize("keep", [None, "5"])
def test_a_dry_run_sweep_says_which_points_the_plan_prunes(tmp_path, capsys, monkeypatch, keep):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    store.append_record(str(tmp_path / "plan.jsonl"), plan_record(run_id="old"))
    store.append_record(str(tmp_path / "plan.jsonl"), plan_record())
    store.append_record(str(tmp_path / "plan.jsonl"), plan_record("llama", "llama3.2-1b", run_id="other"))
    code = cli.main(sweep_argv(tmp_path, *(["--prune-keep", keep] if keep else [])))
    out = capsys.readouterr().out
    assert code == 0, out
    k = int(keep or 3)
    lines = [line.strip() for line in out.splitlines()]
    assert f"--prune-predicted: plan {RUN_ID} ({tmp_path / 'plan.jsonl'}) keeps the best {k} of 8 predicted " \
           f"point(s), prunes {8 - k}:" in lines
    kept = [line for line in lines if "  kept: predicted" in line]
    pruned = [line for line in lines if f"  skipped: pruned by plan {RUN_ID} ({tmp_path / 'plan.jsonl'}): " in line]
    assert len(kept) == k and len(pruned) == 8 - k
    keys = {line.split("  ")[0] for line in kept + pruned}
    assert keys == {f"z{s} off=none fp32 mbs={m}" for s in range(4) for m in (1, 2)}
    assert all(f"of 8; kept the best {k} (best " in line for line in pruned)
    assert not (tmp_path / "s.jsonl").exists()


def test_a_pruned_point_is_recorded_skipped_and_runs_once_a_later_sweep_keeps_it(tmp_path, monkeypatch):
    """The driver's side, without launching anything: ``_attempt`` stands in for the job."""
    from ds_bench.record.schema import SweepPointRecord
    from ds_bench.sweep import driver
    from ds_bench.machine.compute_node import ComputeNode
    from ds_bench.sweep.spec import from_args

    cpu_node = ComputeNode(gpus=0, native_bf16=False, cpus=2, memory_bytes=24 * 2**30)

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    store.append_record(str(tmp_path / "plan.jsonl"), plan_record())
    argv = [a for a in sweep_argv(tmp_path, "--stages", "1") if a != "--dry-run"]

    def sweep_keeping(keep: str) -> list[str]:
        spec, base = from_args(cli.parse([*argv, "--prune-keep", keep]), [], cpu_node)
        sweep, ran = driver.Sweep(spec, base), []

        def attempt(point, repeat, predicted):
            ran.append(point.key)
            record = SweepPointRecord(kind="sweep_point", sweep=sweep.sweep_id, key=point.key, point=point.to_dict(),
                                      repeat=repeat, status="ok", workload="gpt2")
            sweep._append(record)
            return record

        monkeypatch.setattr(sweep, "_attempt", attempt)
        sweep.run()
        return ran

    assert sweep_keeping("1") == ["z1 off=none fp32 mbs=2"]
    skipped = [r for r in store.read_records(str(tmp_path / "s.jsonl"), SweepPointRecord) if r.status == "skipped"]
    assert [r.key for r in skipped] == ["z1 off=none fp32 mbs=1"]
    assert skipped[0].reason.startswith(f"pruned by plan {RUN_ID} ({tmp_path / 'plan.jsonl'}): predicted ")
    assert sweep_keeping("2") == ["z1 off=none fp32 mbs=1"]  # kept now; mbs=2 is measured already
