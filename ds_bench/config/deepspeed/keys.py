"""Which keys a DeepSpeed config may hold, for catching typos DeepSpeed would silently ignore.

DeepSpeed reads top-level keys with ``dict.get`` and a default, so a misspelt top-level key (or
one inside a hand-read section such as ``optimizer``) is dropped without a word. Both levels follow
the installed DeepSpeed: the top level is what its source reads (``ds_reads.top_level_keys``: its
``DeepSpeedConfig`` and ``deepspeed.initialize``, names resolved through its constants modules), the
sections it models with pydantic (ZeRO, offload, bf16, fp16) are read from those models. Where its
source cannot be read (a compiled install) or the scan finds DeepSpeed reading it another way (a core key
missing), the top level is not checked.
"""

from __future__ import annotations

import functools

from ds_bench.config.deepspeed.ds_reads import top_level_keys

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
    top = top_level_keys()
    sections: dict[tuple[str, ...], frozenset[str]] = {(): top} if top else {}
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
