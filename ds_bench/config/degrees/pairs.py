"""Which two parallel degrees compose, as refusals of the pairs that do not: each with the failure and the
DeepSpeed source or version it was seen with. A pair not here composes (none does yet: every run has at most
one degree beyond data parallelism); allowing one is removing its row, with a parity test of the pair against
each degree alone (fp32, 1e-5)."""

from __future__ import annotations

from ds_bench.config.degrees.protocol import DEEPSPEED, DegreeRule, active



def _both(a: str, b: str):
    return lambda l, w: active(a, l, w) and active(b, l, w)


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
               "--workload moe (--expert-parallel {expert_parallel}) with --tensor-parallel {tensor_parallel}: "
               "DeepSpeed's MoE layer takes its tensor-parallel groups from a Megatron mpu, which AutoTP does not give",
               f"{DEEPSPEED}, deepspeed/moe/layer.py _create_process_groups reads groups.mpu",
               {"expert_parallel": 2, "tensor_parallel": 2}),
    DegreeRule("experts and Ulysses", _both("expert_parallel", "sequence_parallel"),
               "--workload moe (--expert-parallel {expert_parallel}) with --sequence-parallel {sequence_parallel}: "
               "DeepSpeed's Ulysses mpu gives the MoE layer the sequence-parallel group as its tensor-parallel one "
               "(parallel_state_sp sets the model-parallel size to the sequence-parallel size; moe/sharded_moe.py "
               "reads it through utils/bwc.py), so it drops capacity slots and all-gathers expert outputs across ranks "
               "holding different tokens: gloo fails 'ProcessGroupGloo::allgather: invalid tensor size', NCCL trains "
               "wrong", f"{DEEPSPEED}, runtime/sequence_parallel/parallel_state_sp.py and moe/sharded_moe.py "
               "(issue 44: tiny Mixtral, fp32, ZeRO-1, SP=2 x EP=2)", {"expert_parallel": 2, "sequence_parallel": 2}),
)
"""The pairs refused, in the legality table's order."""
