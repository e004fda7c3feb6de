"""What one rank's optimizer holds once it has stepped, measured as live tensor bytes (after the timed loop, so the
walk never disturbs a step): the master copy of the parameters it updates, and its state (Adam's two moments, Muon's
momentum), against which ``ds_bench.perf.states.optimizer_bytes_per_param`` is checked (docs/options.md).

DeepSpeed's engine wraps the optimizer that steps (``torch.optim.AdamW``, ``MuonWithAuxAdam``...) in its ZeRO or
bf16 optimizer; the inner one (``.optimizer``) holds the partitions it updates as its parameters. Those that are not
the model's own parameters are the master copy (ZeRO 1-3 clone an fp32 or, with ``bf16_master_weights_and_grads``,
a bf16 partition); its ``state`` tensors are the moments. ``muon_params``: the model's parameters DeepSpeed tagged
``use_muon`` (``deepspeed.set_optimizer_flags``), whole-model counts.
"""

from __future__ import annotations

import torch

from ds_bench.engines import full_numel


PARTITIONS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
"""DeepSpeed's ZeRO-1/2 and ZeRO-3 lists of the master partitions the inner optimizer updates."""


def _inner(optimizer):
    """The optimizer that steps inside DeepSpeed's wrappers."""
    seen = 0
    while hasattr(optimizer, "optimizer") and seen < 4:
        optimizer, seen = optimizer.optimizer, seen + 1
    return optimizer


def _bytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def state_bytes(engine) -> dict | None:
    """``{"master_bytes", "moments_bytes", "muon_params"}`` of this rank's optimizer; None where it has none the walk
    knows (a pipeline's or an offloaded CPU optimizer's state is counted the same way)."""
    outer = getattr(engine, "optimizer", None)
    inner = _inner(outer) if outer is not None else None
    if inner is None or not hasattr(inner, "param_groups"):
        return None
    own = {id(p) for p in engine.module.parameters()}
    held = [p for g in inner.param_groups for p in g["params"]]
    for name in PARTITIONS:  # ZeRO-3 empties the inner param groups between steps
        held += [t for t in getattr(outer, name, None) or [] if isinstance(t, torch.Tensor)]
    master = sum(_bytes(p) for p in {id(p): p for p in held if id(p) not in own}.values())
    moments = sum(_bytes(t) for state in inner.state.values() for t in state.values())
    muon = sum(full_numel(p) for p in engine.module.parameters() if getattr(p, "use_muon", False))
    return {"master_bytes": master, "moments_bytes": moments, "muon_params": muon}

