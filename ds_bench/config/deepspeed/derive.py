"""A point's DeepSpeed config, derived from the base config (``--ds-config`` plus ``--set``), pure.

Only what the point names changes: ``zero_optimization.stage``; the offload sections (kept from the
base when it has them, so ``pin_memory``, buffer sizes and ``nvme_path`` survive; otherwise CPU with
pinned memory; ``zenflow``: optimizer offload with the base's ZenFlow settings, else DeepSpeedExamples'); the precision sections (``bf16.enabled`` / ``fp16.enabled``, other keys of those
sections kept); ``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps``, with
``train_batch_size`` left ``auto`` for the run to resolve against the real world size. Everything
else (optimizer, scheduler, buckets, clipping) is the base config's.
"""

from __future__ import annotations

import copy
import os
import types

from ds_bench.config.deepspeed.prepare import write_config
from ds_bench.config.deepspeed.switch_sections import zenflow_section
from ds_bench.config.layout import SWITCHES, Layout, from_run

_CPU_OFFLOAD = {"device": "cpu", "pin_memory": True}


def derive(base: dict, point: Layout) -> dict:
    cfg = copy.deepcopy(base)
    zero = dict(cfg.get("zero_optimization") or {})
    zero["stage"] = point.stage
    for section, wanted in (("offload_optimizer", point.offload in ("optimizer", "all", "zenflow")),
                            ("offload_param", point.offload == "all")):
        if wanted:
            kept = dict(zero.get(section) or {})
            zero[section] = {**_CPU_OFFLOAD, **kept} if kept.get("device") in ("cpu", "nvme") else dict(_CPU_OFFLOAD)
        else:
            zero.pop(section, None)
    if point.offload == "zenflow":
        zero["zenflow"] = zenflow_section(zero.get("zenflow"))
        _without_torch_adam(cfg)
    else:
        zero.pop("zenflow", None)
    cfg["zero_optimization"] = zero
    for name in ("bf16", "fp16"):
        section = dict(cfg.get(name) or cfg.get("bfloat16" if name == "bf16" else name) or {})
        section["enabled"] = point.precision == name
        cfg[name] = section
    cfg.pop("bfloat16", None)
    cfg["train_micro_batch_size_per_gpu"] = point.micro_batch
    cfg["gradient_accumulation_steps"] = point.grad_accum
    cfg["train_batch_size"] = "auto"
    return cfg


def _without_torch_adam(cfg: dict) -> None:
    """ZenFlow builds its own AdamW from ``optimizer.params`` (``ops/adam/zenflow_torch_adam.py``), keys DeepSpeed pops
    for the others included: deepspeed 0.19.8 fails at the first step with ``torch_adam`` there (``TypeError:
    AdamW.__init__() got an unexpected keyword argument 'torch_adam'``), so a ZenFlow point leaves it and ``fused``
    out (the shipped configs ask torch's fused AdamW with them)."""
    params = (cfg.get("optimizer") or {}).get("params")
    if isinstance(params, dict):
        cfg["optimizer"] = {**cfg["optimizer"], "params": {k: v for k, v in params.items()
                                                            if k not in ("torch_adam", "fused")}}


def write_derived(path: str, base: dict, point: Layout) -> str:
    """``derive(base, point)`` written to ``path`` (its folder created); returns ``path``."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_config(path, derive(base, point))
    return path


def axes_of(base: dict) -> dict:
    """The base config's own stage, offload, precision, micro-batch and accumulation: each axis's
    default when the command line leaves it out (``auto`` / missing micro-batch: None). A config as read (not yet
    normalised) reads the same: DeepSpeed's legacy ``cpu_offload`` / ``cpu_offload_param`` and ``"enabled": "true"``
    count, and ``bf16.enabled: "auto"`` is bf16 (``prepare.resolve_auto``'s rule)."""
    zero = base.get("zero_optimization") or {}
    device = lambda s: ((zero.get(s) or {}).get("device") or "none")  # noqa: E731
    param = device("offload_param") != "none" or _on(zero.get("cpu_offload_param"))
    optimizer = device("offload_optimizer") != "none" or _on(zero.get("cpu_offload"))
    offload = "all" if param else ("zenflow" if zero.get("zenflow") else "optimizer") if optimizer else "none"
    bf16 = _on((base.get("bf16") or base.get("bfloat16") or {}).get("enabled"), auto=True)
    fp16 = _on((base.get("fp16") or {}).get("enabled"))
    mbs = base.get("train_micro_batch_size_per_gpu")
    ga = base.get("gradient_accumulation_steps")
    return {"stage": int(zero.get("stage") or 0), "offload": offload,
            "precision": "bf16" if bf16 else "fp16" if fp16 else "fp32",
            "micro_batch": mbs if isinstance(mbs, int) else None, "grad_accum": ga if isinstance(ga, int) else 1,
            "switches": {s.field: s.normal(s.of_config(base)) for s in SWITCHES if s.of_config is not None}}


def _on(value, auto: bool = False) -> bool:
    """A DeepSpeed boolean as its pydantic models read it (``true``, ``"true"``, ``"1"``...); ``"auto"``: ``auto``."""
    if isinstance(value, str):
        return auto if value == "auto" else value.strip().lower() in ("true", "1", "yes", "on", "t", "y")
    return value is True or value == 1 and not isinstance(value, float)


def layout_of_run(config: dict, ds_cfg: dict | None, recorded: dict) -> Layout:
    """The layout a run trained (pure): its record's ``config`` (``RunConfig.to_dict()``: the flags) and its resolved
    DeepSpeed config (stage, offload, precision, micro-batch, accumulation), else the record's own ``zero_stage``,
    ``precision``, ``micro_batch`` and ``grad_accum`` (``recorded``; offload then unknown: none). What a run record's
    ``layout`` holds, and what an older record without one is read as (``ds_bench.record.run_schema.RunRecord``)."""
    axes = axes_of(ds_cfg) if ds_cfg else {
        "stage": recorded.get("zero_stage") or 0, "offload": "none", "precision": recorded.get("precision") or "fp32",
        "micro_batch": recorded.get("micro_batch"), "grad_accum": recorded.get("grad_accum") or 1}
    return from_run(types.SimpleNamespace(**{"engine": recorded.get("engine")} | config), axes)
