"""Which keys a DeepSpeed config may hold, for catching typos DeepSpeed would silently ignore.

DeepSpeed reads top-level keys with ``dict.get`` and a default, so a misspelt top-level key (or
one inside a hand-read section such as ``optimizer``) is dropped without a word. The top level is
a curated list from the DeepSpeed config reference (docs/_pages/config-json.md) and
``deepspeed/runtime/constants.py``; the sections DeepSpeed models with pydantic (ZeRO, offload,
bf16, fp16) are read from the installed DeepSpeed, so they follow its version.
"""

from __future__ import annotations

import functools

TOP_LEVEL = frozenset("""
train_batch_size train_micro_batch_size_per_gpu gradient_accumulation_steps optimizer scheduler
fp16 bf16 bfloat16 amp torch_autocast gradient_clipping prescale_gradients gradient_predivide_factor
communication_data_type seq_parallel_communication_data_type gradient_allreduce_op sparse_gradients
zero_optimization zero_allow_untested_optimizer zero_force_ds_cpu_optimizer steps_per_print
wall_clock_breakdown memory_breakdown dump_state disable_allgather activation_checkpointing
flops_profiler comms_logger tensorboard wandb csv_monitor comet aio elasticity sparse_attention
pipeline checkpoint data_types data_efficiency curriculum_learning compression_training autotuning
quantize_training eigenvalue progressive_layer_drop dataloader_drop_last hybrid_engine nebula
weight_quantization compile tensor_parallel expert_parallel use_data_before_expert_parallelism
log_level disable_python_gc timers graph_harvesting use_node_local_storage load_universal_checkpoint
mics_shard_size mics_hierarchical_params_gather zenflow vocabulary_size
""".split())

HAND_READ_SECTIONS = {
    "optimizer": frozenset({"type", "params", "legacy_fusion"}),
    "scheduler": frozenset({"type", "params"}),
    "activation_checkpointing": frozenset({
        "partition_activations", "contiguous_memory_optimization", "cpu_checkpointing",
        "number_checkpoints", "synchronize_checkpoint_boundary", "profile",
    }),
    "flops_profiler": frozenset({
        "enabled", "recompute_fwd_factor", "profile_step", "module_depth", "top_modules",
        "detailed", "output_file",
    }),
}


def _model_keys(model) -> frozenset[str]:
    keys = set()
    for name, info in model.model_fields.items():
        keys.add(name)
        if info.alias:
            keys.add(info.alias)
    return frozenset(keys)


@functools.cache
def section_keys() -> dict[tuple[str, ...], frozenset[str]]:
    """Dotted section path -> keys allowed there."""
    sections: dict[tuple[str, ...], frozenset[str]] = {(): TOP_LEVEL}
    sections.update({(name,): keys for name, keys in HAND_READ_SECTIONS.items()})
    try:
        from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
        from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
        from deepspeed.runtime.zero.offload_config import (
            DeepSpeedZeroOffloadOptimizerConfig,
            DeepSpeedZeroOffloadParamConfig,
        )
    except ImportError:  # an older DeepSpeed: check the top level only
        return sections
    sections[("zero_optimization",)] = _model_keys(DeepSpeedZeroConfig)
    sections[("zero_optimization", "offload_optimizer")] = _model_keys(DeepSpeedZeroOffloadOptimizerConfig)
    sections[("zero_optimization", "offload_param")] = _model_keys(DeepSpeedZeroOffloadParamConfig)
    sections[("bf16",)] = _model_keys(DeepSpeedBF16Config)
    sections[("fp16",)] = _model_keys(DeepSpeedFP16Config)
    return sections
