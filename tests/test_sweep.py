"""``ds-bench sweep``: pure parts on inline inputs, then real sweeps of real 2-rank jobs.

Real sweeps here: an MNIST sweep interrupted with SIGINT after its first point and re-run (no
finished point runs twice, the table is complete, invalid combinations are skipped with reasons);
a sweep whose points overrun a tiny ``--timeout``; and a GPT-2 tiny sweep over ZeRO 0-3 with
``--micro-batch auto`` under a per-rank memory cap (``--cpu-mem-limit``), where large micro-batches
fail to allocate for real. GPT-2 tiny rather than MNIST for the cap: its 50,257-word logits take
~300 MiB per sample at sequence length 512 (measured, one rank, ZeRO-0 fp32: peak RSS 779 MiB at
micro-batch 1, 1,105 MiB at 2; ZeRO-3: 886 and 1,189 MiB), so under a 1,050 MiB cap micro-batch 2
fails to allocate and each stage's search takes two jobs; MNIST's CNN takes ~1 MiB per sample and
would need ~11 doublings per stage to reach its boundary.
"""

from __future__ import annotations

import json
import sys
import time

import psutil
import pytest

from ds_bench.config import parsers
from ds_bench.config.deepspeed.derive import axes_of, derive
from ds_bench.config.layout import Layout, parse_key
from ds_bench.config.legality import Where
from ds_bench.errors import UserError
from ds_bench.jobs import ledger, outcome
from ds_bench.perf.grid import grid, next_auto_micro_batch, skip_reason
from ds_bench.record.schema import RunRecord
from ds_bench.sweep import axes, driver
from tests.conftest import ds_bench, explain, full_tier, interrupt_after_first_ok, records, run_cmd, size_of

BASE = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}, "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1, "reduce_bucket_size": "auto"}}


def why(layout, device_type, world_size=None):
    """The reason a study skips ``layout``, as the sweep and capacity search say it."""
    return skip_reason(layout, Where(world_size, device_type))


# ---- pure ----------------------------------------------------------------------------------------

def test_grid_is_family_by_family_with_micro_batches_ascending():
    pts = grid((0, 3), ("none",), ("fp32",), (8, 2), (1,))
    assert [p.key for p in pts] == ["z0 off=none fp32 mbs=2", "z0 off=none fp32 mbs=8",
                                    "z3 off=none fp32 mbs=2", "z3 off=none fp32 mbs=8"]
    assert Layout(2, "optimizer", "bf16", 4, 4).key == "z2 off=optimizer bf16 mbs=4 ga=4"


def test_attention_and_compile_are_axes_with_their_own_families_and_run_flags():
    pts = grid((0,), ("none",), ("bf16",), (4,), (1,), attns=("sdpa", "eager"), compiles=(False, True))
    assert [p.key for p in pts] == ["z0 off=none bf16 mbs=4 attn=sdpa", "z0 off=none bf16 mbs=4 attn=sdpa compile",
                                    "z0 off=none bf16 mbs=4 attn=eager", "z0 off=none bf16 mbs=4 attn=eager compile"]
    assert len({p.family for p in pts}) == 4
    assert pts[3].run_flags() == ["--attn", "eager", "--compile"] and Layout(0, "none", "bf16", 4).run_flags() == []
    d = Layout(1, "none", "fp32", 32)
    assert parse_key("attn=eager compile", d) == Layout(1, "none", "fp32", 32, attn="eager", compile=True)
    assert Layout.from_dict(pts[3].to_dict()) == pts[3]
    assert Layout.from_dict({"stage": 0, "offload": "none", "precision": "fp32", "micro_batch": 1}).compile is False
    piped = Layout(1, "none", "fp32", 1, pipeline_stages=2, compile=True)
    assert "--compile with --pipeline-stages 2" in why(piped, "cpu", 2)
    assert "--attn eager" in why(Layout(1, "none", "fp32", 1, pipeline_stages=2, attn="eager"), "cpu", 2)
    with pytest.raises(ValueError, match="'attn=math' is not"):
        parse_key("attn=math", d)


def test_tensor_parallelism_is_an_axis_of_deepspeed_points():
    pts = grid((1,), ("none",), ("fp32",), (4,), (1,), engines=("deepspeed", "ddp"), degrees={"tensor_parallel": (1, 2)})
    assert [p.key for p in pts] == ["z1 off=none fp32 mbs=4", "tp2 z1 off=none fp32 mbs=4", "ddp z0 off=none fp32 mbs=4"]
    tp2 = pts[1]
    assert tp2.run_flags() == ["--tensor-parallel", "2"] and tp2.model_parallel == 2 and tp2.family != pts[0].family
    assert parse_key("tp2 z1 mbs=4", Layout(0, "none", "fp32", 1)) == tp2
    assert Layout.from_dict(tp2.to_dict()) == tp2 and Layout.from_dict(pts[0].to_dict()).tensor_parallel == 1
    assert why(tp2, "cpu", 2) is None
    assert "does not divide the world size 3" in why(tp2, "cpu", 3)
    assert "--engine ddp with --tensor-parallel 2" in why(Layout(0, "none", "fp32", 1, engine="ddp", tensor_parallel=2), "cpu")
    assert "DeepSpeed #7147" in why(Layout(1, "none", "fp32", 1, pipeline_stages=2, tensor_parallel=2), "cpu", 4)


def test_invalid_combinations_have_reasons():
    assert "offloading (zero_optimization.offload_*) needs ZeRO stage 1, 2 or 3" in why(Layout(0, "optimizer", "fp32", 1), "cpu")
    assert "offload_param needs ZeRO stage 3" in why(Layout(2, "all", "fp32", 1), "cpu")
    assert "fp16 on CPU ranks" in why(Layout(1, "none", "fp16", 1), "cpu")
    assert why(Layout(1, "none", "fp16", 1), "cuda") is None
    assert why(Layout(3, "all", "bf16", 1), "cpu") is None


@pytest.mark.parametrize("largest_that_fits,tried", [
    (12, [1, 2, 4, 8, 16, 12, 14, 13]),
    (1, [1, 2]),
    (0, [1]),
    (300, [1, 2, 4, 8, 16, 32, 64, 128, 256]),  # the limit ends the doubling
])
def test_auto_micro_batch_doubles_then_bisects(largest_that_fits, tried):
    seen = {}
    while (m := next_auto_micro_batch(seen, 256)) is not None:
        seen[m] = "fits" if m <= largest_that_fits else "oom"
    assert list(seen) == tried
    fits = [m for m, r in seen.items() if r == "fits"]
    assert max(fits, default=0) == min(largest_that_fits, 256)


def test_point_keys_parse_with_defaults():
    d = Layout(1, "none", "fp32", 32)
    assert parse_key("z2 off=optimizer mbs=128", d) == Layout(2, "optimizer", "fp32", 128)
    assert parse_key("bf16 ga=4", d) == Layout(1, "none", "bf16", 32, 4)
    assert parse_key(d.key, Layout(0, "all", "bf16", 1)) == d
    with pytest.raises(ValueError, match="'off=disk' is not"):
        parse_key("off=disk", d)


def test_derive_sets_exactly_what_the_point_names():
    cfg = derive(BASE, Layout(3, "all", "fp32", 16, 2))
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3 and zero["reduce_bucket_size"] == "auto"
    assert zero["offload_optimizer"]["device"] == "cpu" and zero["offload_param"]["device"] == "cpu"
    assert cfg["bf16"] == {"enabled": False} and cfg["fp16"] == {"enabled": False}
    assert (cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"], cfg["train_batch_size"]) == (16, 2, "auto")
    assert cfg["optimizer"] == BASE["optimizer"] and BASE["zero_optimization"] == {"stage": 1, "reduce_bucket_size": "auto"}
    back = derive(cfg, Layout(2, "none", "bf16", 4))
    assert "offload_optimizer" not in back["zero_optimization"] and "offload_param" not in back["zero_optimization"]
    assert back["bf16"]["enabled"] is True


def test_derive_keeps_the_base_offload_settings():
    base = {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/x", "pin_memory": False}}}
    assert derive(base, Layout(2, "optimizer", "bf16", 1))["zero_optimization"]["offload_optimizer"] == \
        {"device": "nvme", "nvme_path": "/x", "pin_memory": False}
    assert axes_of(base) == {"stage": 2, "offload": "optimizer", "precision": "fp32", "micro_batch": None, "grad_accum": 1,
                             "switches": {"optimizer": "", "master_states": "", "sp_path": "", "deepcompile": False}}
    assert axes_of(BASE)["precision"] == "bf16"


def _failed(kind, peers=None, error="why"):
    return RunRecord(workload="mnist", status="failed", error=error, failure={"kind": kind, "peers": peers or {}})


OK_RUN = RunRecord(workload="mnist", status="ok")


def test_classification_reads_records_and_exit_status():
    assert outcome.classify([OK_RUN], 0, False, 60) == ("ok", None)
    assert outcome.classify([OK_RUN], 0, True, 60)[0] == "timeout"
    lost_peer = _failed("error", peers={"1": "gone"}, error="peer gone")
    assert outcome.classify([lost_peer, _failed("oom", error="rank 1: out of memory")], 1, False, 60) == \
        ("oom", "rank 1: out of memory")
    assert outcome.classify([lost_peer, _failed("error", error="own")], 1, False, 60) == ("crashed", "own")
    assert outcome.classify([], -9, False, 60) == ("crashed", "killed by SIGKILL with no record")
    assert outcome.classify([], 139, False, 60) == ("crashed", "exit code 139 (SIGSEGV) with no record")
    assert outcome.classify([OK_RUN], 1, False, 60)[0] == "crashed"  # ok record, failed job


def test_parsers_of_the_axes():
    assert parsers.parse_list("--stages", "3,0,3", allowed=(0, 1, 2, 3), kind=int) == (3, 0)
    assert parsers.parse_duration("--timeout", "15m") == 900 and parsers.parse_duration("--timeout", "90s") == 90
    assert parsers.parse_duration("--queue-timeout", "1d") == 86400
    assert axes.parse_micro_batches("auto", 8) is None and axes.parse_micro_batches(None, 8) == (8,)
    assert axes.parse_micro_batches(None, None) is None
    with pytest.raises(UserError, match="--timeout '1w'"):
        parsers.parse_duration("--timeout", "1w")


def test_the_ledger_keeps_the_latest_attempt_and_only_final_ones(tmp_path):
    path = tmp_path / "s.jsonl"
    rows = [{"kind": "sweep_point", "sweep": "A", "key": "k", "repeat": 0, "status": "crashed", "workload": "m"},
            {"kind": "sweep_point", "sweep": "A", "key": "k", "repeat": 0, "status": "ok", "workload": "m"},
            {"kind": "sweep_point", "sweep": "A", "key": "t", "repeat": 0, "status": "timeout", "workload": "m"},
            {"kind": "sweep_point", "sweep": "B", "key": "x", "repeat": 0, "status": "ok", "workload": "m"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = driver.load_ledger(str(path), "A")
    assert set(done) == {("k", 0), ("t", 0)} and done[("k", 0)].status == "ok"
    assert ledger.final(done, ("k", 0)) and ledger.final(done, ("t", 0)) is None


# ---- real sweeps ---------------------------------------------------------------------------------

MNIST_SWEEP = ["--workload", "mnist", "--ds-config", "ds_configs/zero1.json", "--precision", "fp32", "--nproc", "2",
               "--steps", "6", "--warmup", "2", "--launcher", "torchrun"]
"""torchrun (this node): ~4 s less per point than the deepspeed launcher, which test_distributed's sweep
and the pipeline sweep below run."""


def point_records(path):
    return [r for r in records(path) if r.get("kind") == "sweep_point"]


@pytest.mark.dist
@pytest.mark.full  # make test's 15 minutes; CI runs it in the full tier
def test_an_interrupted_sweep_resumes_without_running_a_finished_point_twice(tmp_path):
    results = tmp_path / "s.jsonl"
    argv = [sys.executable, "-m", "ds_bench", "sweep", *MNIST_SWEEP, "--stages", "0,1", "--offload", "none,all",
            "--micro-batch", "16", "--results", str(results), "--master-port", "29641"]
    interrupt_after_first_ok(argv, tmp_path / "first.log", 240, lambda: point_records(results))
    first = point_records(results)
    assert sum(r["status"] == "ok" for r in first) == 1
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(results.with_suffix(".runs.jsonl")) in " ".join(p.info["cmdline"] or [])]

    again = run_cmd(argv, timeout=600)
    assert again.returncode == 0, explain(again)
    recs = point_records(results)
    ok = [r for r in recs if r["status"] == "ok"]
    assert sorted(r["key"] for r in ok) == ["z0 off=none fp32 mbs=16", "z1 off=none fp32 mbs=16"]
    assert len(ok) == 2 and len({r["run_id"] for r in ok}) == 2  # no finished point ran twice
    ok_runs = [r for r in records(results.with_suffix(".runs.jsonl")) if r["status"] == "ok"]
    assert len(ok_runs) == 2, [r["tag"] for r in ok_runs]
    skipped = {r["key"]: r["reason"] for r in recs if r["status"] == "skipped"}
    assert skipped == {key: skip_reason(parse_key(key, Layout(0, "none", "fp32", 16)), Where(2, "cpu"))
                       for key in ("z0 off=all fp32 mbs=16", "z1 off=all fp32 mbs=16")}
    assert "needs ZeRO stage 1, 2 or 3" in skipped["z0 off=all fp32 mbs=16"]
    assert "recorded before: finished points are kept" in again.stdout
    table = (tmp_path / "s.md").read_text()
    assert all(f"| {k}" in table or f" {k} " in table for k in [*skipped, *(r["key"] for r in ok)]), table


@pytest.mark.dist
def test_a_point_past_its_timeout_is_recorded_and_the_sweep_goes_on(tmp_path):
    results = tmp_path / "s.jsonl"
    start = time.monotonic()
    proc = ds_bench("sweep", *MNIST_SWEEP, "--stages", "0,1", "--micro-batch", "16", "--timeout", "3s",
                    "--results", str(results), "--master-port", "29651", timeout=300)
    recs = point_records(results)
    assert [r["status"] for r in recs] == ["timeout", "timeout"], explain(proc)
    assert all("no result within 3 s" in r["reason"] for r in recs)
    assert proc.returncode == 1 and "recommended: none" in proc.stdout, explain(proc)
    assert time.monotonic() - start < 120
    assert "log: " in proc.stdout


GPT2_CAP = "1050MiB"


@pytest.fixture(scope="module")
def capped_auto_sweep(tmp_path_factory):
    results = tmp_path_factory.mktemp("auto") / "s.jsonl"
    proc = ds_bench("sweep", "--workload", "gpt2", "--size", "tiny", "--seq-len", "512", "--ds-config",
                    "ds_configs/zero1.json", "--precision", "fp32", "--stages", "0,3", "--micro-batch", "auto",
                    "--max-micro-batch", "16", "--cpu-mem-limit", GPT2_CAP, "--no-prune", "--nproc", "2",
                    "--launcher", "torchrun", "--steps", "3",
                    "--warmup", "1", "--results", str(results), "--master-port", "29661", timeout=900,
                    HF_HUB_OFFLINE="1")
    return results, proc


@pytest.mark.dist
@pytest.mark.full  # make test's 15 minutes; CI runs it in the full tier
def test_auto_micro_batch_under_a_memory_cap_finds_the_largest_that_fits(capped_auto_sweep):
    results, proc = capped_auto_sweep
    assert proc.returncode == 0, explain(proc)
    recs = point_records(results)
    assert any(r["status"] == "oom" for r in recs), explain(proc)
    assert {r["status"] for r in recs} <= {"ok", "oom", "skipped"}, [(r["key"], r["status"], r["reason"]) for r in recs]
    for stage in (0, 3):  # replicated and fully sharded: the two ends of what fits
        mine = [r for r in recs if r["point"]["stage"] == stage]
        fits = sorted(r["point"]["micro_batch"] for r in mine if r["status"] == "ok")
        too_big = sorted(r["point"]["micro_batch"] for r in mine if r["status"] != "ok")
        assert fits and too_big and fits[-1] < too_big[0], (stage, fits, too_big)
        assert too_big[0] == fits[-1] + 1 or too_big[0] <= 2 * fits[-1]  # bisected down to neighbours
        powers = [2**k for k in range(8) if 2**k <= fits[-1]]
        assert set(powers) <= set(fits), (stage, fits)  # the powers of two below it measured
    predicted = [(r["key"], r["predicted_mem_bytes"] / r["peak_mem_bytes"]) for r in recs
                 if r["status"] == "ok" and r["predicted_mem_bytes"]]
    # calibrated on the first ok point, then predicted for every later one (at least ZeRO-3's first;
    # the prediction's accuracy over stages 0-3 is tests/test_sweep_predict.py's)
    assert len(predicted) >= 1 and all(0.8 <= ratio <= 1.3 for _, ratio in predicted), predicted
    print("predicted/measured peak:", predicted)
    for r in recs:
        if r["status"] == "oom" and r["run_id"]:  # an allocation that really failed, per the run's own record
            runs = [x for x in records(results.with_suffix(".runs.jsonl")) if x["run_id"] == r["run_id"]]
            assert any((x.get("failure") or {}).get("kind") == "oom" for x in runs)


@pytest.mark.dist
@pytest.mark.full  # make test's 15 minutes; CI runs it in the full tier
def test_the_recommended_point_is_the_fastest_that_fits_and_its_config_runs(capped_auto_sweep, tmp_path, request):
    """The written config runs at a world size it was not measured at (one process, no launcher); the full
    tier runs it at the 2 ranks of the sweep too, under torchrun."""
    results, proc = capped_auto_sweep
    ok = [r for r in point_records(results) if r["status"] == "ok"]
    cap = 1050 * 2**20
    fitting = [r for r in ok if r["peak_mem_bytes"] <= 0.9 * cap]
    best = max(fitting, key=lambda r: r["throughput"])
    line = next(x for x in proc.stdout.splitlines() if x.startswith("recommended: "))
    assert line.startswith(f"recommended: {best['key']} "), (line, [(r["key"], r["throughput"]) for r in fitting])
    config = results.parent / "s-recommended.json"
    written = json.loads(config.read_text())
    assert "train_batch_size" not in written  # measured at 2 ranks, it must run at any world size
    assert written == {k: v for k, v in best["ds_config"].items() if k != "train_batch_size"}
    assert "measured at 2 rank(s)" in next(x for x in proc.stdout.splitlines() if x.startswith("config: "))
    launchers = {1: [sys.executable, "-m", "ds_bench"]}  # one process, no launcher
    if full_tier(request.config):
        launchers[2] = ["torchrun", "--nproc_per_node", "2", "--master_port", "29671", "-m", "ds_bench"]
    for ranks, launcher in launchers.items():
        out = tmp_path / f"r{ranks}.jsonl"
        run = run_cmd([*launcher, "run", "--workload", "gpt2", "--size", "tiny", "--seq-len", "512", "--ds-config",
                       str(config), "--steps", "3", "--warmup", "1", "--results", str(out)], timeout=300,
                      HF_HUB_OFFLINE="1")
        assert run.returncode == 0, explain(run)
        (r,) = records(out)
        assert r["status"] == "ok" and r["micro_batch"] == best["point"]["micro_batch"] and r["world_size"] == ranks
        assert r["train_batch_size"] == ranks * r["micro_batch"] * r["grad_accum"]
    assert r["zero_stage"] == best["point"]["stage"]


@pytest.mark.dist
@pytest.mark.full
def test_a_sweep_with_a_pipeline_axis_runs_pp2_under_the_deepspeed_launcher(tmp_path):
    """``--pipeline-stages 1,2``: the pipeline point runs through the sweep's launcher (the deepspeed
    launcher, named: a study's default on one node is torchrun; 2 ranks, one data-parallel replica) beside the
    data-parallel one, and is ranked with it."""
    results = tmp_path / "s.jsonl"
    proc = ds_bench("sweep", "--workload", "gpt2", "--ds-config", "zero1.json", "--stages", "1", "--precision", "fp32",
                    "--pipeline-stages", "1,2", "--micro-batch", "2", "--grad-accum", "2", "--steps", "3", "--warmup",
                    "1", "--results", str(results), "--master-port", "29690", "--timeout", "4m", "--launcher", "deepspeed",
                    "--", "--layers", "4", "--hidden", "64", "--heads", "4", "--seq-len", "32",
                    timeout=600, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    assert proc.returncode == 0, explain(proc)
    keys = {r["key"]: r for r in point_records(results)}
    pipe, plain = keys["pp2 z1 off=none fp32 mbs=2 ga=2"], keys["z1 off=none fp32 mbs=2 ga=2"]
    assert pipe["status"] == "ok" and plain["status"] == "ok", keys
    assert pipe["schedule_bubble"] == pytest.approx(1 / 3) and 0 < pipe["bubble"] < 1, pipe  # (P-1)/(m+P-1), P = m = 2
    assert plain["bubble"] is None and plain["schedule_bubble"] is None
    rows = [line for line in proc.stdout.splitlines() if line[:1] in "=0123456789"]  # the ranked table
    (pp2_row,) = [line for line in rows if " pp2 z1 " in line]
    assert "bubble % (schedule)" in proc.stdout and f" {pipe['bubble'] * 100:.0f} (33) " in pp2_row + " ", pp2_row
    (pp2,) = [r for r in records(results.with_suffix(".runs.jsonl")) if size_of(r, "pipeline_stages") == 2]
    assert (pp2["launcher"], pp2["world_size"], pp2["data_parallel_size"]) == ("deepspeed", 2, 1)
    assert pp2_row.split()[1:3] == ["pp2", "z1"]

