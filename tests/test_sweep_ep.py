"""Expert parallelism in the studies' axes and the memory prediction (pure, inline numbers; the plan of ``ds-bench
sweep --dry-run`` as a subprocess).

The prediction (``perf.states.expert_parallel_groups``): an EP-way rank holds Ψ_e/EP of the experts' Ψ_e
parameters, ZeRO partitioning them over the W/EP ranks holding the same experts, and the rest over all W; at
EP = 1 it is the dense formula over every parameter. The sweep's ``--expert-parallel 1,2`` gives ``ep2`` points, a
dense workload refuses the axis by name, a value not dividing the experts is refused before anything runs.
"""

from __future__ import annotations

import argparse

import pytest

from ds_bench.config.layout import Layout
from ds_bench.errors import UserError
from ds_bench.perf.states import ModelShape, expert_parallel_groups, model_states_bytes, models
from ds_bench.workloads import moe_shapes
from tests.conftest import ds_bench, explain

PSI, EXPERTS, LAYER = 1_000_000, 600_000, 50_000
MOE = ModelShape(PSI, LAYER, EXPERTS)
REST = PSI - EXPERTS


def states(shape, stage, precision="fp32", ep=1, n=2, rpn=2, offload="none"):
    return model_states_bytes(shape, Layout(stage, offload, precision, 1, expert_parallel=ep), n, rpn, "cpu")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("stage, offload", [(0, "none"), (1, "none"), (2, "none"), (1, "optimizer"), (2, "optimizer")])
def test_at_ep1_a_moe_model_is_predicted_as_a_dense_one_of_its_total_parameters(stage, offload, precision):
    dense = ModelShape(PSI, LAYER)
    for n in (2, 4):
        assert states(MOE, stage, precision, 1, n, n, offload) == states(dense, stage, precision, 1, n, n, offload)


def test_the_groups_zero_partitions_apart():
    """EP = 2 on 4 ranks: Ψ_e/2 experts over the 2 ranks holding the same ones; the rest over all 4."""
    assert expert_parallel_groups(MOE, 2, 4, 4) == [(ModelShape(EXPERTS // 2, 0), 2, 2),
                                                    (ModelShape(REST, LAYER), 4, 4)]
    assert expert_parallel_groups(MOE, 1, 4, 4) == [(MOE, 4, 4)]
    assert expert_parallel_groups(ModelShape(PSI, LAYER), 2, 4, 4) == [(ModelShape(PSI, LAYER), 4, 4)]


@pytest.mark.parametrize("precision, stage, per_expert_param", [
    ("fp32", 1, 4 / 2 + 16 / 2 - (4 + 16 / 2)),   # DeepSpeed 0.19.8's fp32 ZeRO-1/2: 4Ψ + 16Ψ/N, per group
    ("fp32", 2, 4 / 2 + 16 / 2 - (4 + 16 / 2)),
    ("bf16", 1, 4 / 2 + 12 / 2 - (4 + 12 / 2)),   # ZeRO paper, P_os: 4Ψ + 12Ψ/N
])
def test_ep2_on_2_ranks_shards_the_replicated_weights_and_gradients_of_the_experts(precision, stage, per_expert_param):
    """The optimizer states of the experts are 1/W of them per rank at every EP (ZeRO partitions them over W/EP
    ranks, each holding 1/EP); what EP saves is the experts' replicated 4 bytes per parameter, halved: 2 Ψ_e."""
    ep1, ep2 = states(MOE, stage, precision, 1), states(MOE, stage, precision, 2)
    assert ep2 - ep1 == per_expert_param * EXPERTS == -2 * EXPERTS
    assert ep2 == states(ModelShape(REST, LAYER), stage, precision) + states(ModelShape(EXPERTS // 2, 0), stage,
                                                                                  precision, n=1, rpn=1)


def test_bf16_zero2_sums_deepspeeds_estimator_over_the_two_groups():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs as estimate

    host_experts, device_experts = estimate(EXPERTS // 2, num_gpus_per_node=1, num_nodes=1, cpu_offload=False,
                                            additional_buffer_factor=1.5)
    host_rest, device_rest = estimate(REST, num_gpus_per_node=2, num_nodes=1, cpu_offload=False,
                                      additional_buffer_factor=1.5)
    expected = device_experts + device_rest + host_experts / 1 + host_rest / 2
    assert states(MOE, 2, "bf16", 2) == int(expected)


def test_expert_parallel_layouts_are_modelled():
    assert models(Layout(1, "none", "fp32", 1, expert_parallel=2))
    assert not models(Layout(1, "none", "fp32", 1, pipeline_stages=2))


def test_a_moe_shape_counts_its_experts_from_the_run_flags():
    tiny = moe_shapes.run_shape("tiny", None, None, None, None, None)
    assert tiny == moe_shapes.SHAPES["tiny"] and moe_shapes.expert_param_count(tiny) == 2 * 4 * 3 * 64 * 128
    six = moe_shapes.run_shape("tiny", None, None, None, 6, None)
    assert (six.experts, six.top_k) == (6, 2)
    custom = moe_shapes.run_shape(None, 2, 64, 4, None, None)
    assert (custom.experts, custom.top_k, custom.n_layer, custom.hidden) == (8, 2, 2, 64)
    assert moe_shapes.largest_layer_params(tiny) == moe_shapes.GPT2_VOCAB * 64  # the embedding, as the record counts


def flags(**given):
    base = dict(workload="moe", size=None, layers=None, hidden=None, heads=None, experts=None, top_k=None,
                expert_parallel=None, capacity_factor=0.0, aux_loss_weight=None, moe_path="auto")
    return argparse.Namespace(**{**base, **given})


def test_the_moe_workload_checks_a_studys_expert_parallel_values_against_its_experts():
    from ds_bench.workloads import REGISTRY

    moe, gpt2 = REGISTRY["moe"], REGISTRY["gpt2"]
    moe.check_study({"expert_parallel": (1, 2, 4)}, flags(size="tiny"))  # 4 experts
    with pytest.raises(UserError, match=r"^--expert-parallel 4 does not divide the model's 6 experts"):
        moe.check_study({"expert_parallel": (1, 2, 4)}, flags(size="tiny", experts=6))
    with pytest.raises(UserError, match=r"^--top-k 5 is above the model's 4 experts"):
        moe.check_study({}, flags(size="tiny", top_k=5))
    with pytest.raises(UserError, match=r"^--expert-parallel: workload gpt2 has no experts \(moe has\)"):
        gpt2.check_study({"expert_parallel": (1, 2)}, flags(workload="gpt2"))
    with pytest.raises(UserError, match=r"^--experts: workload gpt2 has no experts"):
        gpt2.check_study({"expert_parallel": (1,)}, flags(workload="gpt2", experts=4))
    assert moe.expert_param_count(flags(size="tiny")) == 2 * 4 * 3 * 64 * 128
    assert gpt2.expert_param_count(flags(workload="gpt2")) == 0


def test_the_sweep_memory_model_predicts_an_ep_point_with_the_experts_sharded():
    from ds_bench.record.schema import SweepPointRecord
    from ds_bench.perf.peak_memory import MemoryModel

    MiB = 2**20
    z1, z2 = (Layout(s, "none", "fp32", 2, expert_parallel=2) for s in (1, 2))
    model = MemoryModel(world=2, per_node=2, device_type="cpu", capacity=8192 * MiB, expert_params=EXPERTS)
    peak = 200 * MiB + states(MOE, 1, ep=2) + 2 * 10 * MiB
    model.learn_from([SweepPointRecord(kind="sweep_point", sweep="s", key=z1.key, repeat=0, status="ok",
                                       workload="moe", point=z1.to_dict(), params=PSI, largest_layer_params=LAYER,
                                       peak_mem_bytes=peak, baseline_mem_bytes=200 * MiB)])
    assert model.predict(z1) == peak
    assert model.predict(z2) == 200 * MiB + states(MOE, 2, ep=2) + 2 * 10 * MiB
    assert model.predict(Layout(1, "none", "fp32", 2)) is None  # EP = 1 is calibrated on its own points


def sweep_plan(tmp_path, *args):
    return ds_bench("sweep", "--ds-config", "zero1.json", "--precision", "fp32", "--micro-batch", "1", "--dry-run",
                    "--results", str(tmp_path / "s.jsonl"), *args, HF_HUB_OFFLINE="1")


def test_the_sweep_plans_ep_points_and_says_why_it_skips_some(tmp_path):
    proc = sweep_plan(tmp_path, "--workload", "moe", "--size", "tiny", "--stages", "0,1,3", "--expert-parallel",
                      "1,2", "--", "--experts", "4", "--top-k", "2", "--capacity-factor", "1.5",
                      "--aux-loss-weight", "0.01")
    assert proc.returncode == 0, explain(proc)
    lines = [line.strip() for line in proc.stdout.splitlines()]
    assert "ep2 z1 off=none fp32" in lines and "z1 off=none fp32" in lines
    assert any(line.startswith("ep2 z0 off=none fp32  skipped: --expert-parallel 2 with ZeRO stage 0")
               for line in lines)
    assert any(line.startswith("ep2 z3 off=none fp32  skipped: --workload moe under ZeRO stage 3") for line in lines)
    assert not (tmp_path / "s.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (("--workload", "gpt2", "--size", "tiny", "--expert-parallel", "1,2"),
     "--expert-parallel: workload gpt2 has no experts (moe has)"),
    (("--workload", "moe", "--size", "tiny", "--nproc", "4", "--expert-parallel", "1,4", "--", "--experts", "6"),
     "--expert-parallel 4 does not divide the model's 6 experts"),
    (("--workload", "gpt2", "--size", "tiny", "--", "--top-k", "2"), "--top-k: workload gpt2 has no experts"),
])
def test_the_sweep_refuses_an_ep_axis_its_model_cannot_take_in_one_line(tmp_path, args, message):
    proc = sweep_plan(tmp_path, *args)
    assert proc.returncode == 2, explain(proc)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ds-bench: error:")]
    assert len(errors) == 1 and message in errors[0] and "Traceback" not in proc.stderr, explain(proc)
