"""ds_bench.perf.states and ds_bench.perf.peak_memory: model-state formulas per stage, DeepSpeed's estimators
for bf16 ZeRO 2/3, calibration, scaling with micro-batch and precision, fits/headroom (pure, inline numbers);
the capacity of a CPU rank (``machine.compute_node.ComputeNode.rank_memory_bytes``); and one real 2-rank check of predicted against
measured peaks."""

from __future__ import annotations

import dataclasses

import psutil
import pytest

from ds_bench.config.layout import Layout
from ds_bench.machine.compute_node import this_machine
from ds_bench.perf.peak_memory import Calibration, calibrate, fits, predict_peak_bytes
from ds_bench.perf.states import ModelShape, model_states_bytes
from ds_bench.record.schema import RunRecord
from tests.conftest import explain, records, run_cmd

PSI, LAYER = 1_000_000, 100_000
SHAPE = ModelShape(PSI, LAYER)
MiB = 2**20


def states(stage, offload="none", precision="fp32", n=2, rpn=2, device="cpu"):
    return model_states_bytes(SHAPE, Layout(stage, offload, precision, 1), n, rpn, device)


@pytest.mark.parametrize("stage, n, expected", [
    (0, 2, 16 * PSI), (0, 4, 16 * PSI),                      # ZeRO paper: 4Ψ + 4Ψ + 8Ψ
    (1, 2, 4 * PSI + 8 * PSI), (1, 4, 4 * PSI + 4 * PSI),    # DeepSpeed 0.19.8: 4Ψ + 16Ψ/N
    (2, 2, 12 * PSI), (2, 4, 8 * PSI),
    (3, 2, 10 * PSI + 4 * LAYER), (3, 4, 5 * PSI + 4 * LAYER),  # 20Ψ/N + 4L
])
def test_fp32_states_per_stage(stage, n, expected):
    assert states(stage, n=n) == expected


def test_a_tensor_parallel_rank_holds_its_share_partitioned_over_the_data_parallel_ranks():
    """T = 2 on 4 ranks: Ψ/2 per rank, ZeRO over the 2 data-parallel ranks: the T = 1 formula at Ψ/2, N = 2."""
    tp2 = lambda stage: model_states_bytes(SHAPE, Layout(stage, "none", "fp32", 1, tensor_parallel=2), 4, 4, "cpu")  # noqa: E731
    assert tp2(0) == 16 * PSI // 2
    assert tp2(1) == 4 * PSI // 2 + 16 * PSI // 2 // 2
    assert tp2(3) == 20 * PSI // 2 // 2 + 4 * LAYER // 2
    assert tp2(1) < states(1, n=4) < states(1, n=2)


def test_each_tensor_parallel_degree_is_calibrated_on_its_own_points():
    from ds_bench.record.schema import SweepPointRecord
    from ds_bench.perf.peak_memory import MemoryModel

    def ok(point, peak):
        return SweepPointRecord(kind="sweep_point", sweep="s", key=point.key, repeat=0, status="ok", workload="llama", point=point.to_dict(),
                                params=PSI, largest_layer_params=LAYER, peak_mem_bytes=peak, baseline_mem_bytes=200 * MiB)

    dp, tp = Layout(1, "none", "fp32", 2), Layout(1, "none", "fp32", 2, tensor_parallel=2)
    model = MemoryModel(world=2, per_node=2, device_type="cpu", capacity=4096 * MiB)
    model.learn_from([ok(dp, 600 * MiB)])
    assert model.predict(dp.with_micro_batch(4)) is not None and model.predict(tp.with_micro_batch(4)) is None
    model.learn_from([ok(tp, 500 * MiB), ok(tp.with_micro_batch(4), 700 * MiB)])  # 100 MiB per sample at T = 2
    assert model.predict(tp.with_micro_batch(8)) == pytest.approx(1100 * MiB, rel=1e-6)
    assert model.surely_too_big(5000 * MiB, tp) and not model.surely_too_big(5000 * MiB, dp)  # one run: 2x margin


def test_fp32_offload_splits_device_and_host():
    # ZeRO-2 offload at N=2: device 4Ψ + 4L, host 20Ψ/N + 4L per rank
    assert states(2, "optimizer", device="cuda") == 4 * PSI + 4 * LAYER
    assert states(2, "optimizer", device="cpu") == 4 * PSI + 4 * LAYER + 10 * PSI + 4 * LAYER
    assert states(3, "all", device="cuda") == 4 * LAYER
    assert states(3, "all", device="cpu") == states(3, "none", device="cpu")


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_stage_0_and_1_follow_the_paper(precision):
    assert states(0, precision=precision) == 16 * PSI            # 2Ψ + 2Ψ + 12Ψ
    assert states(1, precision=precision) == 4 * PSI + 6 * PSI   # 4Ψ + 12Ψ/N, N=2
    assert states(1, precision=precision, n=4) == 4 * PSI + 3 * PSI
    assert states(1, "optimizer", precision, device="cuda") == 4 * PSI


def test_bf16_stage_2_uses_deepspeeds_estimator():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    cpu_node, gpu = estimate_zero2_model_states_mem_needs(PSI, 2, 1, cpu_offload=False, additional_buffer_factor=1.5)
    assert gpu == 2 * PSI + 18 * PSI // 2 and cpu_node == 4 * PSI * 2 * 1.5
    assert states(2, precision="bf16", device="cuda") == gpu
    assert states(2, precision="bf16", device="cpu") == gpu + cpu_node // 2  # host memory shared by 2 ranks
    # offload: 2Ψ on the device, Ψ·max(4N, 16)·1.5 per node on the host
    assert states(2, "optimizer", "bf16", device="cuda") == 2 * PSI
    assert states(2, "optimizer", "bf16", device="cpu") == 2 * PSI + 16 * PSI * 1.5 / 2


def test_bf16_stage_3_uses_deepspeeds_estimator():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    cpu_node, gpu, _ = estimate_zero3_model_states_mem_needs(PSI, LAYER, 2, 1, cpu_offload=False,
                                                            cpu_offload_params=False, zero_init=False)
    assert gpu == 4 * LAYER + 18 * PSI // 2
    assert states(3, precision="bf16", device="cuda") == gpu
    assert states(3, precision="bf16", device="cpu") == gpu + cpu_node // 2
    assert states(3, "all", "bf16", device="cuda") == 4 * LAYER  # params offloaded too
    # two nodes of 2: the device share halves, the host per node is per node
    assert states(3, precision="bf16", n=4, device="cuda") == 4 * LAYER + 18 * PSI // 4


def ok_record(peak_mib, baseline_mib, params=PSI, layer=LAYER):
    return RunRecord.model_validate({"workload": "mnist", "status": "ok", "params": params, "largest_layer_params": layer,
                                     "metrics": {"peak_mem_bytes": int(peak_mib * MiB),
                                                 "baseline_mem_bytes": int(baseline_mib * MiB)}})


def test_calibration_from_one_run():
    point = Layout(0, "none", "fp32", 4)
    states_mib = 16 * PSI / MiB
    cal = calibrate(ok_record(300 + states_mib + 40, 300), point, 2, 2, "cpu")
    assert cal == Calibration(300 * MiB, pytest.approx(10 * MiB), "fp32", 0, point.key)
    # a peak below baseline + states: floored at 0, not negative activations
    assert calibrate(ok_record(301, 300), point, 2, 2, "cpu").activation_bytes_per_sample == 0


def test_calibration_from_two_runs_separates_the_fixed_part():
    small, large = Layout(0, "none", "fp32", 4), Layout(0, "none", "fp32", 12)
    s = 16 * PSI / MiB
    cal = calibrate(ok_record(300 + s + 30 + 40, 300), small, 2, 2, "cpu",
                    second=(ok_record(300 + s + 30 + 120, 300), large))
    assert cal.activation_bytes_per_sample == pytest.approx(10 * MiB)
    assert cal.fixed_bytes == pytest.approx(30 * MiB, abs=1)
    # another family or the same micro-batch: one-run calibration
    other = Layout(1, "none", "fp32", 12)
    assert calibrate(ok_record(400, 300), small, 2, 2, "cpu", second=(ok_record(500, 300), other)).fixed_bytes == 0


@pytest.mark.parametrize("record", [
    None, {"status": "failed", "metrics": {}}, {"status": "ok", "metrics": {"peak_mem_bytes": 1}},
    {"status": "ok", "params": 5, "largest_layer_params": 1, "metrics": {"peak_mem_bytes": 9}},
])
def test_no_calibration_from_a_failed_or_incomplete_record(record):
    record = None if record is None else RunRecord.model_validate({"workload": "mnist", **record})
    assert calibrate(record, Layout(0, "none", "fp32", 4), 2, 2, "cpu") is None


def test_prediction_scales_linearly_with_micro_batch_and_element_size():
    cal = Calibration(baseline_bytes=300 * MiB, activation_bytes_per_sample=10 * MiB, precision="fp32",
                      fixed_bytes=5 * MiB)
    base = 300 * MiB + 5 * MiB + 16 * PSI
    for mbs in (1, 8, 64):
        assert predict_peak_bytes(SHAPE, Layout(0, "none", "fp32", mbs), 2, 2, "cpu", cal) == base + mbs * 10 * MiB
    bf16 = Layout(0, "none", "bf16", 8)  # 2 bytes per element against the calibration's 4
    assert predict_peak_bytes(SHAPE, bf16, 2, 2, "cpu", cal) == base + 8 * 5 * MiB
    assert predict_peak_bytes(SHAPE, Layout(0, "none", "fp32", 8), 2, 2, "cpu", None) is None


def test_fits_keeps_the_headroom_free():
    assert fits(90, 100, 10) and not fits(91, 100, 10)
    assert fits(100, 100, 0) and not fits(101, 100, 0)
    assert fits(None, 100, 10)  # no prediction: only a run can tell
    with pytest.raises(ValueError, match="headroom_pct"):
        fits(1, 100, 100)
    with pytest.raises(ValueError, match="headroom_pct"):
        fits(1, 100, -1)


def test_device_capacity_on_cpu():
    here = dataclasses.replace(this_machine(), gpus=0)  # its CPU ranks, on a GPU machine too
    assert here.rank_memory_bytes(2, cpu_mem_limit=4 * 2**30) == 4 * 2**30
    assert here.rank_memory_bytes(2) == psutil.virtual_memory().total // 2


# Real runs. Factors measured on this machine (2 CPU ranks, fp32, mnist CNN, synthetic data): see
# test_prediction_against_real_runs. One-run calibration over-predicts (the first step's fixed cost
# is read as per-sample memory: x1.72 alone and x2.10 beside another worker's runs on 2026-11-26, AMD EPYC); two
# runs of the calibration family bring it near 1 (x0.95 in the first).
ONE_RUN_RANGE = (1.3, 2.5)
TWO_RUN_RANGE = (0.8, 1.25)
SECOND_RUN_GAIN = 1.3
"""The second calibration run takes at least this factor off the one-run over-prediction (x1.72 -> x0.95)."""
CALIBRATION_MBS = (8, 32)
TARGET_MBS = 128


@pytest.mark.dist
@pytest.mark.full
def test_prediction_against_real_runs(tmp_path):
    """Stage 0 at micro-batches 8 and 32 calibrate; stage 3 at 128 (fully sharded, the far end from the
    calibration; the sweep's capped test predicts within 0.8-1.3x too) is predicted, then run."""
    results = tmp_path / "r.jsonl"
    plan = [Layout(0, "none", "fp32", m) for m in CALIBRATION_MBS] + [
        Layout(s, "none", "fp32", TARGET_MBS) for s in (3,)]
    for i, point in enumerate(plan):
        proc = run_cmd(["torchrun", "--nproc_per_node", "2", "--master_port", str(29540 + i), "-m", "ds_bench",
                        "run", "--workload", "mnist", "--ds-config", f"ds_configs/zero{point.stage}.json",
                        "--steps", "4", "--warmup", "1", "--micro-batch", str(point.micro_batch),
                        "--set", "bf16.enabled=false", "--results", str(results)], timeout=180)
        assert proc.returncode == 0, explain(proc)
    recs = records(results)
    assert len(recs) == len(plan) and all(r["status"] == "ok" for r in recs)
    shape = ModelShape(recs[0]["params"], recs[0]["largest_layer_params"])
    first, second = RunRecord.model_validate(recs[0]), RunRecord.model_validate(recs[1])
    one = calibrate(first, plan[0], 2, 2, "cpu")
    two = calibrate(first, plan[0], 2, 2, "cpu", second=(second, plan[1]))
    rows = []
    for point, rec in zip(plan[2:], recs[2:]):
        measured = rec["metrics"]["peak_mem_bytes"]
        p1, p2 = (predict_peak_bytes(shape, point, 2, 2, "cpu", c) for c in (one, two))
        rows.append((point, p1 / measured, p2 / measured))
        print(f"{point.key:28} measured {measured / MiB:6.0f} MiB  predicted {p1 / MiB:6.0f} MiB (one run, "
              f"x{p1 / measured:.2f})  {p2 / MiB:6.0f} MiB (two runs, x{p2 / measured:.2f})")
    for point, r1, r2 in rows:
        assert ONE_RUN_RANGE[0] <= r1 <= ONE_RUN_RANGE[1], (point.key, r1)
        assert TWO_RUN_RANGE[0] <= r2 <= TWO_RUN_RANGE[1], (point.key, r2)
        assert r1 >= SECOND_RUN_GAIN * r2, (point.key, r1, r2)
