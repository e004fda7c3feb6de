"""Which two parallel degrees compose, as refusals of the pairs that do not: each with the failure and the
DeepSpeed source or version it was seen with. A pair not here composes: experts and Ulysses on the DeepSpeed
they were verified with (``ds_bench.engines.degrees.moe_sequence_parallel``, ``tests/test_moe_sequence_parallel.py``);
allowing another is removing its row, with a parity test of the pair against each degree alone (fp32, 1e-5)."""

from __future__ import annotations

from ds_bench.config.degrees import protocol
from ds_bench.config.degrees.protocol import DEEPSPEED, DegreeRule, active



def _both(a: str, b: str):
    return lambda l, w: active(a, l, w) and active(b, l, w)


def _off_version(a: str, b: str):
    """Both active, with a DeepSpeed other than the one the pair was verified with."""
    return lambda l, w: _both(a, b)(l, w) and protocol.installed_deepspeed() != DEEPSPEED


PAIR_RULES: tuple[DegreeRule, ...] = (
    DegreeRule("AutoTP and a pipeline", _both("tensor_parallel", "pipeline_stages"),
               "--tensor-parallel {tensor_parallel} with --pipeline-stages {pipeline_stages}: AutoTP does not combine "
               "with DeepSpeed's pipeline engine (DeepSpeed #7147)",
               f"{DEEPSPEED}; github.com/deepspeedai/DeepSpeed/issues/7147", {"tensor_parallel": 2, "pipeline_stages": 2}),
    DegreeRule("Ulysses and a pipeline", _both("sequence_parallel", "pipeline_stages"),
               "--sequence-parallel {sequence_parallel} with --pipeline-stages {pipeline_stages}: DeepSpeed's pipeline "
               "engine takes no sequence-parallel groups", f"{DEEPSPEED}: PipelineEngine builds its own grid, no "
               "Ulysses mpu", {"sequence_parallel": 2, "pipeline_stages": 2}),
    DegreeRule("Ulysses and AutoTP", _both("sequence_parallel", "tensor_parallel"),
               "--sequence-parallel {sequence_parallel} with --tensor-parallel {tensor_parallel}: DeepSpeed's Ulysses "
               "groups (parallel_state_sp) have no tensor-parallel dimension to combine with AutoTP's",
               f"{DEEPSPEED}, deepspeed/runtime/sequence_parallel/parallel_state_sp.py: sequence and data groups only",
               {"sequence_parallel": 2, "tensor_parallel": 2}),
    DegreeRule("experts and a pipeline", _both("expert_parallel", "pipeline_stages"),
               "--workload moe (--expert-parallel {expert_parallel}) with --pipeline-stages {pipeline_stages}: "
               "ds_bench's pipeline model is GPT-2's, which has no experts",
               "ds_bench's pipeline GPT-2 is its own PipelineModule", {"expert_parallel": 2, "pipeline_stages": 2}),
    DegreeRule("experts and AutoTP", _both("expert_parallel", "tensor_parallel"),
               "--workload moe (--expert-parallel {expert_parallel}) with --tensor-parallel {tensor_parallel}: AutoTP "
               "rejects Mixtral's HF tp_plan ('unsupported partition style(s): moe_tp_experts, packed_colwise': it "
               "names HF's stacked experts, which DeepSpeed's MoE layer replaced), and with the plan cut to attention "
               "the MoE layer's tensor-parallel token gather fails on gloo ('ProcessGroupGloo::allgather: invalid "
               "tensor size')", f"{DEEPSPEED}, module_inject/tp_plan_converter.py and moe/mappings.py _gather_tokens "
               "(issue 44, measured: tiny Mixtral, fp32, ZeRO-1, TP=2 x EP=2 on 2 CPU ranks)",
               {"expert_parallel": 2, "tensor_parallel": 2}),
    DegreeRule("experts and Ulysses off the verified DeepSpeed", _off_version("expert_parallel", "sequence_parallel"),
               "--workload moe (--expert-parallel {expert_parallel}) with --sequence-parallel {sequence_parallel}: "
               "ds_bench composes them by giving DeepSpeed's MoE layer a tensor-parallel size of 1 under Ulysses' mpu "
               "(whose model-parallel group is the sequence-parallel one), measured with " + DEEPSPEED + " only; the "
               "installed DeepSpeed is another version",
               f"{DEEPSPEED}, moe/sharded_moe.py and moe/mappings.py read utils/bwc.py; "
               "ds_bench.engines.degrees.moe_sequence_parallel (issue 44: tiny Mixtral, fp32, ZeRO-1, SP=2 x EP=2)",
               {"expert_parallel": 2, "sequence_parallel": 2}),
)
"""The pairs refused, in the legality table's order."""
