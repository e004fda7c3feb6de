"""Building a model partitioned (DeepSpeed ZeRO-3 ``deepspeed.zero.Init``): each parameter is split across
the ranks as it is created, so no rank ever holds the whole model.

``partitioned_build`` is the context the model is built in (``ds_bench.run.training.build``): ``zero.Init``
under DeepSpeed ZeRO-3 when the workload allows it (``Workload.partitioned_build``: its FLOPs need no
forward pass and its weight init gathers what it writes), a no-op otherwise. ``building_partitioned``
tells a workload's ``build_model`` it runs inside one; ``gathered`` gathers parameters around code that
writes them (rank 0's writes are kept); ``full_numel`` counts a parameter whole, partitioned or not.
"""

from __future__ import annotations

import contextlib
import gc
import sys

import torch

from ds_bench.engines.deepspeed_engine import config_for


def partitioned_build(choice, ds_cfg: dict, workload_allows: bool) -> contextlib.AbstractContextManager:
    """``deepspeed.zero.Init`` for a DeepSpeed ZeRO-3 ``choice`` (an ``EngineChoice``) whose workload allows
    it, parameters created in the compute dtype (the config's, checked against ``choice.model_dtype``);
    ``contextlib.nullcontext()`` otherwise (stages 0-2, DDP, FSDP, or a workload that needs the whole model
    on every rank)."""
    if choice.name != "deepspeed" or choice.zero_stage != 3 or not workload_allows:
        return contextlib.nullcontext()
    import deepspeed

    # The config as deepspeed.initialize gets it (AutoTP: its batch counted over every rank).
    # No dtype argument: deepspeed 0.19.8's Init._set_dtype reads `dtype or torch.float16 if fp16_supported
    # else torch.bfloat16 if ...`, i.e. `(dtype or fp16) if ... else ...`: on a CPU accelerator (no fp16) any
    # dtype given becomes bfloat16 (fp32 runs then train bf16 weights). Without one it takes the config's.
    init = deepspeed.zero.Init(config_dict_or_path=config_for(choice, ds_cfg))
    if init.dtype != choice.model_dtype:
        raise RuntimeError(f"deepspeed.zero.Init would create {init.dtype} parameters, the run computes in "
                           f"{choice.model_dtype}")
    return _settled(init)


@contextlib.contextmanager
def _settled(init):
    """``init``, then a garbage collection: a parameter replaced during the build (GPT-2's LM head weight,
    created, partitioned, then tied to the embedding) is held in reference cycles DeepSpeed's partitioned
    parameters form, so only the collector frees its shard (measured: 25 MiB per rank on a 122 MiB GPT-2)."""
    with init:
        yield
    gc.collect()


def building_partitioned() -> bool:
    """Whether a ``deepspeed.zero.Init`` context is open (modules built now are partitioned as created)."""
    zero = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    return bool(zero and getattr(zero, "zero_init_context", 0) > 0)


def is_partitioned(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are ZeRO-3 partitioned (built under ``zero.Init``)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def full_numel(p: torch.nn.Parameter) -> int:
    """Elements of the whole parameter: ``ds_numel`` when partitioned (``numel()`` is then this rank's 0)."""
    return getattr(p, "ds_numel", p.numel())


def gathered(params: list[torch.nn.Parameter]) -> contextlib.AbstractContextManager:
    """Every rank holds ``params`` whole inside; what rank 0 wrote is partitioned back on exit. Parameters
    that are not partitioned pass through untouched (a no-op when none is)."""
    if not any(hasattr(p, "ds_id") for p in params):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=0)
