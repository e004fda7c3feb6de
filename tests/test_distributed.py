"""Real 2-rank CPU runs (gloo) through the deepspeed launcher and torchrun, for ZeRO 0-3 and the DDP
and FSDP baselines beside them.

The ZeRO matrix goes through ``ds-bench sweep --launcher deepspeed``, which starts ``deepspeed --num_gpus 2 --module ds_bench run ...`` per point: ZeRO 0, 2 and 3 in fp32
(ZeRO-1 too in the full tier) and ZeRO-2 with its optimizer offloaded (DeepSpeedCPUAdam, the op ``make test`` builds), each given
``--busbw`` so the comm-bound verdict is checked per stage. The baselines go through a second sweep,
``--engines ddp,fsdp`` under torchrun (a study's default on one node; ``make bench``'s): DDP, FSDP at stages 2 and 3
in fp32 (the launcher does not change what an engine computes, and torchrun starts a point ~5 s sooner); DDP and FSDP-3 in bf16 are a
third sweep, in the full tier (``make test-full``).
torchrun also runs ZeRO-2 in fp32 with ``--breakdown`` for 60 steps on Fashion-MNIST, which must
learn (DeepSpeed in bf16 under torchrun: ZeRO-2 GPT-2 in tests/test_gpt2.py, ZeRO-3 in
tests/test_checkpoint.py and tests/test_capacity.py; bf16 is emulated on an AVX2-only CPU, ~9x slower,
so the matrix does not run twice). Runs happen once per module; the tests assert on the run records
the points appended.
"""

import math
import re
from pathlib import Path

import pytest

from tests.conftest import ds_bench, explain, full_tier, precision_args, records, run_cmd, shm_buffers

pytestmark = pytest.mark.dist

STAGES = (0, 1, 2, 3)
CI_STAGES = (0, 2, 3)
"""ZeRO-1 (ZeRO-2's optimizer sharding without its gradient sharding) runs in the full tier only; ZeRO-0 stays:
the DDP parity test compares with it."""
LAUNCHER_POINTS = [(stage, "fp32") if stage in CI_STAGES else pytest.param(stage, "fp32", marks=pytest.mark.full)
                   for stage in STAGES]
FSDP_STAGES = {"fp32": (2, 3), "bf16": (3,)}
STEPS, WARMUP = 10, 2
LEARN_STEPS = 60
SLOW_BUSBW = 0.001
"""GB/s given to the deepspeed-launcher points: 1 MB/s, so moving the CNN's gradients takes seconds per step."""


@pytest.fixture(scope="module")
def deepspeed_runs(request, tmp_path_factory, fashion_mnist):
    results = tmp_path_factory.mktemp("ds") / "r.jsonl"
    stages = STAGES if full_tier(request.config) else CI_STAGES
    proc = sweep(results, fashion_mnist, "--stages", ",".join(map(str, stages)), "--engines", "deepspeed", "--point",
                 "z2 off=optimizer", "--launcher", "deepspeed", "--master-port", "29711")
    return records(results.with_suffix(".runs.jsonl")), proc


@pytest.fixture(scope="module")
def baseline_runs(tmp_path_factory, fashion_mnist):
    return baseline_sweep(tmp_path_factory.mktemp("baselines"), fashion_mnist, "--stages", "0,2,3",
                          "--master-port", "29715")


@pytest.fixture(scope="module")
def baseline_bf16_runs(tmp_path_factory, fashion_mnist):
    """DDP and FSDP-3 in bf16 (autocast and MixedPrecisionPolicy): the full tier (bf16 is emulated on AVX2 CPUs)."""
    return baseline_sweep(tmp_path_factory.mktemp("baselines_bf16"), fashion_mnist, "--stages", "3",
                          "--precision", "bf16", "--master-port", "29717")


def baseline_sweep(folder, data, *args):
    """DDP and FSDP points through a torchrun sweep: their run records and the sweep's process."""
    results = folder / "r.jsonl"
    proc = sweep(results, data, "--engines", "ddp,fsdp", *args)  # torchrun: a study's launcher on one node
    return records(results.with_suffix(".runs.jsonl")), proc


def sweep(results, data, *args):
    proc = ds_bench("sweep", "--workload", "mnist", "--ds-config", "ds_configs/zero1.json", "--precision", "fp32",
                    *args, "--micro-batch", "32", "--nproc", "2", "--steps", str(STEPS), "--warmup", str(WARMUP),
                    "--results", str(results), "--data", str(data), "--", "--busbw", str(SLOW_BUSBW), timeout=900)
    assert proc.returncode == 0, explain(proc)
    return proc


@pytest.fixture(scope="module")
def torchrun_run(tmp_path_factory, fashion_mnist):
    """ZeRO-2 fp32 under torchrun with ``--breakdown``, long enough to learn; ``ds-bench roofline`` on the same
    2 ranks first, into the folder of its results, so the run reports ``mfu_vs_measured``."""
    results = tmp_path_factory.mktemp("tr") / "r.jsonl"
    roof = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", "29721", "-m", "ds_bench", "roofline",
                    "--dtypes", "fp32", "--sizes", "128,256", "--min-time", "0.2s", "--copy-bytes", "8MiB",
                    "--results", str(results.parent / "roofline.jsonl")])
    assert roof.returncode == 0, explain(roof)
    proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", "29720", "-m", "ds_bench", "run",
                    "--workload", "mnist", "--ds-config", "ds_configs/zero2.json", "--steps", str(LEARN_STEPS),
                    "--warmup", str(WARMUP), "--data", str(fashion_mnist), "--results", str(results),
                    *precision_args("fp32"), "--breakdown"])
    assert proc.returncode == 0, explain(proc)
    (r,) = records(results)
    return r


def offloaded(r) -> bool:
    return "offload_optimizer" in r["ds_config"]["zero_optimization"]


def find(recs, stage, precision, engine="deepspeed", offload=False):
    match = [r for r in recs if (r["engine"], r["zero_stage"], r["precision"], offloaded(r)) ==
             (engine, stage, precision, offload)]
    assert len(match) == 1, f"expected one record for {engine} ZeRO-{stage} {precision}, got {len(match)}"
    return match[0]


def check_record(r, launcher, stage, precision, steps=STEPS):
    assert r["status"] == "ok" and r["error"] is None
    assert (r["launcher"], r["world_size"], r["zero_stage"], r["precision"]) == (launcher, 2, stage, precision)
    assert r["ds_config"]["zero_optimization"]["stage"] == stage
    assert r["ds_config"]["train_batch_size"] == 2 * r["micro_batch"] == 64
    m = r["metrics"]
    assert m["steps_measured"] == steps - WARMUP and len(m["loss_curve"]) == steps
    assert m["samples_per_s"] > 0 and 0 < m["step_ms_median"] <= m["step_ms_p90"]
    assert m["peak_mem_bytes"] > 50 * 2**20
    assert all(math.isfinite(x) for x in m["loss_curve"])
    assert r["versions"]["deepspeed"] and r["run_id"] and r["time"]
    assert r["build"]["partitioned"] is False and r["build"]["engine_s"] > 0  # MNIST: whole, even under ZeRO-3
    breakdown = r["config"]["breakdown"]  # the torchrun ZeRO-2 fp32 run synchronizes after every phase
    assert (m["timing_mode"], m["syncs_per_step"]) == (("breakdown", 4) if breakdown else ("step", 1))
    # the harness's clock against the window's wall time: within 1% on an idle machine; the bound leaves
    # room for preemption between steps while the other test worker loads both cores
    assert abs(m["rank_steps_vs_wall_pct"]) < 5, m
    assert m["steps_sum_s"] == pytest.approx(m["step_ms_mean"] * m["steps_measured"] / 1e3)


@pytest.mark.parametrize("stage, precision", LAUNCHER_POINTS)
def test_deepspeed_launcher(deepspeed_runs, stage, precision):
    recs, _ = deepspeed_runs
    r = find(recs, stage, precision)
    check_record(r, "deepspeed", stage, precision)
    assert r["optimizer"] == {"source": "ds_config", "type": "AdamW", "fused": True}  # torch's fused kernel


def test_the_launcher_runs_leave_no_buffer_in_dev_shm(deepspeed_runs):
    """The deepspeed launcher sets LOCAL_SIZE, which turns DeepSpeed's shm all-reduce on (torchrun does
    not): each of the sweep's deepspeed-launcher jobs had a buffer (rank 0 released its own, the record says),
    and none left one behind."""
    recs, _ = deepspeed_runs
    assert recs and all(r["rendezvous"]["shm_buffer_released"] is True for r in recs), "no shm buffer was made"
    ports = {r["rendezvous"]["master_port"] for r in recs}
    assert ports and all(shm_buffers(port) == [] for port in ports), "DeepSpeed's shm buffers outlived the runs"


def test_torchrun_sets_no_local_size_so_no_shm_buffer_is_made(torchrun_run):
    assert torchrun_run["rendezvous"]["shm_buffer_released"] is False


def test_roofline_measures_every_rank_and_the_run_reads_its_ceiling(torchrun_run):
    (roof,) = records(Path(torchrun_run["config"]["results"]).parent / "roofline.jsonl")
    rows = roof["results"]
    assert {(r["rank"], r["test"], r["size"]) for r in rows} == {
        (rank, test, size) for rank in (0, 1) for test, size in (("matmul", 128), ("matmul", 256), ("copy", 8 * 2**20))}
    assert all(r["low"] <= r["median"] <= r["high"] and r["median"] > 0 and r["repeats"] == 5 for r in rows)
    best = max(r["median"] for r in rows if r["test"] == "matmul" and r["host"] == torchrun_run["host"])
    m = torchrun_run["metrics"]
    assert m["measured_tflops"] == best and roof["run_id"] in m["measured_note"]
    assert m["mfu_vs_measured"] == pytest.approx(m["tflops_per_device"] / best)


def test_the_record_says_where_the_start_up_went(torchrun_run):
    s = torchrun_run["startup"]
    phases = [k for k in s if k not in ("total_s", "other_s", "compile_s", "process_started_at")]
    assert s["process_started_at"] < torchrun_run["loop_started_at"]
    assert len(phases) == 9 and all(s[k] is not None and s[k] >= 0 for k in phases), s
    assert s["compile_s"] is None  # not compiled (tests/test_compile.py has a compiled run)
    assert s["imports_s"] > 0.5 and s["warmup_s"] > 0  # torch alone takes ~1 s to import here
    assert s["total_s"] == pytest.approx(sum(s[k] for k in phases) + s["other_s"])
    # the named phases hold all but the gaps between them (~0.03 of ~7 s here): a phase left unnamed shows
    assert abs(s["other_s"]) < 0.05 * s["total_s"], s


@pytest.mark.parametrize("runs", ["deepspeed_runs", "baseline_runs"])
def test_the_sweep_says_where_each_point_s_time_went(runs, request):
    """Each ok point's wall time split launch to exit (the phases add up to it), and the summary's table of the
    medians; under the deepspeed launcher and under torchrun, a study's default on one node."""
    recs, proc = request.getfixturevalue(runs)
    points = [p for p in records(Path(recs[0]["config"]["results"]).with_suffix("").with_suffix(".jsonl"))
              if p["kind"] == "sweep_point"]
    assert points and all(p["status"] == "ok" for p in points)
    assert {r["launcher"] for r in recs} == {"deepspeed" if runs == "deepspeed_runs" else "torchrun"}
    for p in points:
        t = p["time_split"]
        parts = [v for k, v in t.items() if k != "wall_s"]
        assert all(v is not None and v >= 0 for v in parts), t
        assert t["wall_s"] == pytest.approx(p["wall_s"], abs=0.01) and sum(parts) == pytest.approx(t["wall_s"], abs=0.01)
        assert t["measured_s"] > 0 and t["launcher_s"] > 0 and t["exit_s"] > 0 and t["imports_s"] > 0.3
    heading, header, _, row = proc.stdout.split("where a point's time goes")[1].splitlines()[:4]
    assert f"median over {len(points)} ok attempt(s)" in heading
    assert header.split()[:2] == ["launcher", "imports"] and header.split()[-1] == "wall"
    walls = sorted(p["time_split"]["wall_s"] for p in points)
    assert float(row.split()[-1]) == pytest.approx(walls[len(walls) // 2] if len(walls) % 2 else
                                                    (walls[len(walls) // 2 - 1] + walls[len(walls) // 2]) / 2, abs=0.06)


def test_torchrun(torchrun_run):
    check_record(torchrun_run, "torchrun", 2, "fp32", steps=LEARN_STEPS)
    assert torchrun_run["comm_bound"]["note"].startswith("no comm record of these 2 gloo ranks in ")  # no verdict


@pytest.mark.parametrize("stage, precision", LAUNCHER_POINTS)
def test_comm_bound_verdict_from_the_stage_bytes_and_busbw(deepspeed_runs, stage, precision):
    """Bus bytes per step from the record's own parameter count (n = 2: (n-1)/n = 1/2), at --busbw:
    stage 0 all-reduces Psi x B x 2(n-1)/n; stages 1-2 reduce-scatter + all-gather the same total;
    stage 3 gathers the parameters twice (1.5x). At 1 MB/s that is far more than the step: comm-bound."""
    r = find(deepspeed_runs[0], stage, precision)
    entry, psi, width = r["comm_bound"], r["params"], 4 if precision == "fp32" else 2
    assert sum(entry["bus_bytes_per_step"].values()) == pytest.approx(psi * width * (1.5 if stage == 3 else 1.0))
    assert set(entry["bus_bytes_per_step"]) == ({"all_reduce"} if stage == 0 else {"reduce_scatter", "all_gather"})
    assert entry["busbw_source"] == "--busbw" and set(entry["busbw_GBps"].values()) == {SLOW_BUSBW}
    assert entry["comm_ms_lower_bound"] == pytest.approx(sum(entry["bus_bytes_per_step"].values()) / 1e6 * 1e3)
    assert entry["step_ms_median"] == r["metrics"]["step_ms_median"]
    assert entry["fraction_of_step"] == pytest.approx(entry["comm_ms_lower_bound"] / entry["step_ms_median"])
    assert entry["fraction_of_step"] > 1 and entry["communication_bound"] is True


@pytest.mark.parametrize("which, launcher, points, ddp_rows, fsdp_rows",
                         [("deepspeed_runs", "deepspeed", None, 0, 0), ("baseline_runs", "torchrun", 3, 1, 2)])
def test_sweep_prints_the_ranked_table(request, which, launcher, points, ddp_rows, fsdp_rows):
    recs, proc = request.getfixturevalue(which)
    points = points or 1 + len(STAGES if full_tier(request.config) else CI_STAGES)  # + the offload point
    lines = proc.stdout.splitlines()
    rows = [line for line in lines
            if re.match(r"^=?\d+\s+((ddp|fsdp) )?z[0-3] off=(none|optimizer) (fp32|bf16) mbs=32\s+ok", line)]
    assert len(rows) == len(recs) == points, proc.stdout
    assert {r["launcher"] for r in recs} == {launcher}, proc.stdout
    assert sum(" ddp z0 " in row for row in rows) == ddp_rows and sum(" fsdp z" in row for row in rows) == fsdp_rows
    assert "median images/s" in proc.stdout and any(line.startswith("recommended: ") for line in lines)


def test_loss_parity_across_zero_stages(deepspeed_runs):
    """Same seed, fp32: every stage computes the same mathematics; only reduction order differs.

    ZeRO 1-3 partition the optimizer state/gradients/parameters and reduce with reduce-scatter
    instead of all-reduce, so the sums are the same numbers added in another order: fp32 rounding
    (~1e-7 relative per op) compounded over 10 Adam steps stays far below 1e-4 relative.
    A real divergence (a wrong shard, a missed gradient) moves the loss by 1e-2 or more.
    """
    ran = {r["zero_stage"] for r in deepspeed_runs[0]}
    curves = [find(deepspeed_runs[0], s, "fp32")["metrics"]["loss_curve"] for s in STAGES if s in ran]
    assert curves[0][-1] < curves[0][0], "the loss should move on real data"
    for curve in curves[1:]:
        assert curve == pytest.approx(curves[0], rel=1e-4)


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.full)])
def test_ddp_and_fsdp_records(request, deepspeed_runs, precision):
    """The baselines run through the same sweep, loop and record as ZeRO; the record says which
    engine ran and how the config was mapped (ds_bench.engines.torch_settings)."""
    recs, _ = request.getfixturevalue("baseline_runs" if precision == "fp32" else "baseline_bf16_runs")
    ddp = find(recs, 0, precision, engine="ddp")
    check_record(ddp, "torchrun", 0, precision)
    assert ddp["engine_plan"]["engine"] == "ddp" and ddp["optimizer"]["type"] == "torch.optim.AdamW"
    for stage in FSDP_STAGES[precision]:
        fsdp = find(recs, stage, precision, engine="fsdp")
        check_record(fsdp, "torchrun", stage, precision)
        assert fsdp["engine_plan"]["reshard_after_forward"] is (stage == 3)
        assert fsdp["engine_plan"]["precision"] == precision
    assert find(deepspeed_runs[0], 3, "fp32")["engine_plan"] is None  # DeepSpeed reads the config itself


def test_loss_parity_of_ddp_with_zero_0_and_fsdp_with_zero_2_and_3(baseline_runs, deepspeed_runs):
    """Same seed, data and fp32 mathematics: DDP all-reduces averaged gradients as ZeRO-0 does, and
    FSDP reduce-scatters and gathers shards as ZeRO-2/3 do, with the same torch AdamW, WarmupLR and
    clipping (the norm over all gradients). Only the order of fp32 sums can differ (bucketing), so
    the same 1e-4 relative bound as across ZeRO stages holds (measured here: equal to 5 decimals);
    a wrong mapping (no clipping, no scheduler, loss not averaged over ranks) moves the loss by 1e-2."""
    recs, zero = baseline_runs[0], deepspeed_runs[0]
    pairs = [(find(recs, 0, "fp32", "ddp"), find(zero, 0, "fp32"))]
    pairs += [(find(recs, s, "fp32", "fsdp"), find(zero, s, "fp32")) for s in FSDP_STAGES["fp32"]]
    for baseline, zero in pairs:
        assert baseline["metrics"]["loss_curve"] == pytest.approx(zero["metrics"]["loss_curve"], rel=1e-4)


def test_cnn_learns_on_real_fashion_mnist(torchrun_run):
    """ZeRO-2 fp32 under torchrun, 60 steps (fp32: emulated bf16 is ~9x slower on an AVX2-only CPU)."""
    curve = torchrun_run["metrics"]["loss_curve"]
    first, last = sum(curve[:3]) / 3, sum(curve[-5:]) / 5
    assert first > 2.0 and last < 0.5 * first, (first, last)


def test_optimizer_offload_trains_like_zero_2(deepspeed_runs):
    """ZeRO-2 with ``offload_optimizer`` on the CPU: DeepSpeed steps its fp32 partition with its own
    DeepSpeedCPUAdam (the ``cpu_adam`` op) instead of torch's AdamW, the same AdamW mathematics in
    another kernel, so the loss curve stays on ZeRO-2's (same seed and data, fp32)."""
    recs, _ = deepspeed_runs
    off, zero2 = find(recs, 2, "fp32", offload=True), find(recs, 2, "fp32")
    check_record(off, "deepspeed", 2, "fp32")
    assert off["ds_config"]["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    print(f"loss ZeRO-2 {zero2['metrics']['loss_curve']}\nloss ZeRO-2 + optimizer offload {off['metrics']['loss_curve']}")
    assert off["metrics"]["loss_curve"] == pytest.approx(zero2["metrics"]["loss_curve"], rel=1e-4)
