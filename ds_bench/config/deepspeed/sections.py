"""The DeepSpeed config sections DeepSpeed models with pydantic: aliases, validation, combinations.

DeepSpeed accepts several spellings of the same setting; ds_bench reads these sections itself
(precision, model dtype, ZeRO stage, offload device), so it rewrites them to one spelling first:
- ``"bfloat16"`` is read when ``"bf16"`` is absent (deepspeed/runtime/precision_config.py,
  ``get_bfloat16_config``): renamed to ``bf16``; giving both is rejected (DeepSpeed would
  silently ignore ``bfloat16``);
- ``"zero_optimization": true|false`` (deepspeed/runtime/zero/config.py,
  ``read_zero_config_deprecated``): stage 1 (with top-level ``allgather_size``) or stage 0;
- deprecated fields and pydantic aliases inside the sections (``cpu_offload``,
  ``cpu_offload_param``, ``"enabled": "true"``...): the section is validated with DeepSpeed's own
  model and written back as the values DeepSpeed will use (``normalize_sections``).

A validation error becomes one line naming the dotted key and what is allowed. ``check_combinations``
mirrors the checks DeepSpeed makes only inside ``deepspeed.initialize``; ``check_flag_keys`` sends a
parallel degree written in the config (``tensor_parallel.autotp_size``, ``sequence_parallel_size``) to
the run flag that lays it out.
"""

from __future__ import annotations

import copy
import functools
import typing
from typing import Any

from ds_bench.errors import UserError

STAGES = (0, 1, 2, 3)


def _models() -> dict[str, Any]:
    """The sections DeepSpeed validates with a pydantic model, each with it. Before deepspeed 0.17.1 bf16 and fp16
    had none (``runtime/config.py`` read them key by key, ``precision_config.py`` came in 0.17.1): their keys are
    then taken as written."""
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    try:
        from deepspeed.runtime.precision_config import DeepSpeedBF16Config, DeepSpeedFP16Config
    except ImportError:
        return {"zero_optimization": DeepSpeedZeroConfig}
    return {"zero_optimization": DeepSpeedZeroConfig, "bf16": DeepSpeedBF16Config, "fp16": DeepSpeedFP16Config}


@functools.cache
def deepspeed_auto_keys() -> frozenset[tuple[str, ...]]:
    """Dotted keys whose ``"auto"`` is DeepSpeed's own value, not a HuggingFace placeholder for ds_bench to
    fill (``zero_optimization.zenflow.select_strategy``...): fields of its models that default to "auto"."""
    found: set[tuple[str, ...]] = set()

    def walk(model, prefix: tuple[str, ...], seen: set) -> None:
        for name, info in model.model_fields.items():
            key = (*prefix, info.alias or name)
            if info.default == "auto":
                found.add(key)
            for inner in _models_in(info.annotation):
                if inner not in seen:
                    walk(inner, key, seen | {inner})

    for section, model in _models().items():
        walk(model, (section,), {model})
    return frozenset(found)


def _models_in(annotation) -> list:
    """The pydantic models an annotation holds (``Optional[ZenFlowConfig]`` -> [ZenFlowConfig])."""
    import pydantic

    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def rename_aliases(cfg: dict, path: str) -> dict:
    """Legacy top-level spellings DeepSpeed accepts -> the one ds_bench reads."""
    out = copy.deepcopy(cfg)
    if "bfloat16" in out:
        if "bf16" in out:
            raise UserError(f"{path}: both \"bf16\" and its legacy alias \"bfloat16\" are given; DeepSpeed reads "
                            "bf16 and ignores bfloat16: keep one")
        out["bf16"] = out.pop("bfloat16")
    zero = out.get("zero_optimization")
    if isinstance(zero, bool):  # DeepSpeed's deprecated boolean form
        out["zero_optimization"] = {"stage": 1 if zero else 0}
        if zero and "allgather_size" in out:
            out["zero_optimization"]["allgather_bucket_size"] = out.pop("allgather_size")
    return out


def format_validation_error(section: str, error: Exception) -> str:
    """pydantic's ValidationError -> ``dotted.key must be ..., got VALUE`` (first error only)."""
    first = error.errors()[0]
    loc = ".".join(str(p) for p in (section, *first["loc"]))
    msg = first["msg"]
    for prefix in ("Assertion failed, ", "Value error, "):
        msg = msg.removeprefix(prefix)
    if not first["loc"]:  # a rule over the whole section
        return f"{loc}: {msg}"
    msg = msg.replace("Input should be", "must be")
    return f"{loc} {msg}, got {first.get('input')!r}"


def normalize_sections(cfg: dict, path: str) -> dict:
    """Validate zero_optimization, bf16 and fp16 with DeepSpeed's models; write back its values."""
    import pydantic

    out = copy.deepcopy(cfg)
    stage = out.get("zero_optimization", {}).get("stage") if isinstance(out.get("zero_optimization"), dict) else None
    if stage is not None and (isinstance(stage, bool) or stage not in STAGES):
        raise UserError(f"{path}: zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    for section, model in _models().items():
        if section not in out:
            continue
        if not isinstance(out[section], dict):
            raise UserError(f"{path}: {section} must be a JSON object, got {out[section]!r}")
        try:
            validated = model(**out[section])
        except pydantic.ValidationError as e:
            raise UserError(f"{path}: {format_validation_error(section, e)}") from None
        except (AssertionError, ValueError, TypeError) as e:  # DeepSpeed's own post-init checks
            raise UserError(f"{path}: {section}: {e}") from None
        out[section] = validated.model_dump(mode="json", exclude_unset=True, by_alias=True,
                                            exclude=_deprecated_fields(model))
    return out


def _deprecated_fields(model) -> set[str]:
    return {name for name, info in model.model_fields.items()
            if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("deprecated")
            and info.json_schema_extra.get("set_new_param", True) and info.json_schema_extra.get("new_param")}


def offload_device(cfg: dict, which: str) -> str:
    """``none``, ``cpu`` or ``nvme`` for ``offload_optimizer`` / ``offload_param`` of a normalised config."""
    node = (cfg.get("zero_optimization") or {}).get(which) or {}
    return node.get("device") or "none"


def check_combinations(cfg: dict, path: str) -> None:
    """Combinations of config keys DeepSpeed rejects (or silently ignores) only inside ``deepspeed.initialize``
    (offload against the ZeRO stage is a layout's: ``ds_bench.config.legality``)."""
    zero = cfg.get("zero_optimization") or {}
    stage = zero.get("stage", 0)
    for which in ("offload_optimizer", "offload_param"):
        device = offload_device(cfg, which)
        if device == "nvme" and not (zero.get(which) or {}).get("nvme_path"):
            raise UserError(f"{path}: zero_optimization.{which}.nvme_path is required with device \"nvme\"")
    bf16 = cfg.get("bf16") or {}
    for key in ("bf16_master_weights_and_grads", "bf16_optimizer_states"):
        if bf16.get(key) and stage == 0:
            raise UserError(f"{path}: bf16.{key} is only supported with ZeRO stage 1, 2 or 3, got stage 0")
    if bf16.get("bf16_optimizer_states") and not bf16.get("bf16_master_weights_and_grads"):
        raise UserError(f"{path}: bf16.bf16_optimizer_states requires bf16.bf16_master_weights_and_grads: true")
    if bf16.get("bf16_master_weights_and_grads") and not bf16.get("bf16_optimizer_states") and \
            offload_device(cfg, "offload_optimizer") not in ("cpu", "nvme"):
        raise UserError(f"{path}: bf16.bf16_master_weights_and_grads without bf16.bf16_optimizer_states needs "
                        "zero_optimization.offload_optimizer (DeepSpeed: 'Master weights feature requires ZeRO "
                        "Offload with DeepSpeedCPUAdam')")
    optimizer = cfg.get("optimizer") if isinstance(cfg.get("optimizer"), dict) else {}
    params = optimizer.get("params") if isinstance(optimizer.get("params"), dict) else {}
    if zero.get("zenflow") and params.get("torch_adam"):
        raise UserError(f"{path}: optimizer.params.torch_adam with zero_optimization.zenflow: ZenFlow builds its own "
                        "AdamW from optimizer.params and deepspeed 0.19.8 passes torch_adam on to it (TypeError: "
                        "unexpected keyword argument 'torch_adam'); leave it out")
    if (cfg.get("fp16") or {}).get("fp16_master_weights_and_grads") and stage == 0:
        raise UserError(f"{path}: fp16.fp16_master_weights_and_grads is only supported with ZeRO stage 1, 2 or 3")
    if str(cfg.get("gradient_allreduce_op", "")).lower() == "sum" and stage == 3:
        raise UserError(f"{path}: gradient_allreduce_op \"sum\" is not supported with ZeRO stage 3")


FLAG_KEYS = {
    ("tensor_parallel", "autotp_size"): ("--tensor-parallel", 0,
                                         "which lays out the batch and the data for it (the ranks of a group read the same batch)"),
    ("sequence_parallel_size",): ("--sequence-parallel", 1,
                                  "which wraps the attention in Ulysses and shards each sequence over the group"),
}
"""Degrees DeepSpeed reads from the config that ds_bench lays out from a run flag: (flag, the value that
means "none", what the flag does that the key alone would not). ``1`` and the "none" value pass quietly."""


def check_flag_keys(cfg: dict, path: str) -> None:
    """A parallel degree written in the config (AutoTP's, Ulysses') -> the run flag that gives it."""
    for key, (flag, none, why) in FLAG_KEYS.items():
        node = cfg
        for part in key[:-1]:
            node = node.get(part) if isinstance(node.get(part), dict) else {}
        if key[-1] not in node:
            continue
        value, dotted = node[key[-1]], ".".join(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < none:
            raise UserError(f"{path}: {dotted} must be an integer >= {none}, got {value!r}; "
                            f"a degree above 1 is given as {flag} N")
        if value > 1:
            raise UserError(f"{path}: {dotted} {value}: give it as {flag} {value} instead, {why}")


def check_with_deepspeed(cfg: dict, path: str) -> None:
    """Last net: build DeepSpeed's own ``DeepSpeedConfig`` (as ``deepspeed.initialize`` does first)
    from the resolved config; whatever it rejects is bad input, reported before any rank joins.
    ``train_batch_size`` is left out: ds_bench checked it against the real world size already."""
    import logging

    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.utils import logger

    level = logger.level
    logger.setLevel(logging.ERROR)  # it logs its world size at INFO
    try:
        DeepSpeedConfig({k: v for k, v in cfg.items() if k != "train_batch_size"})
    except Exception as e:  # DeepSpeed raises assertions, ValueError, its own errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{path}: DeepSpeed rejects this config: {first}") from None
    finally:
        logger.setLevel(level)
