"""Loading and resolving a DeepSpeed JSON config before ``deepspeed.initialize`` sees it.

Pipeline (``prepare``): parse the JSON (errors give line and column) -> apply ``--set`` overrides
-> rename legacy aliases (``ds_sections``) -> reject unknown keys with the nearest valid one (``keys``)
-> send parallel degrees written in the config to their run flags -> resolve HuggingFace-style
``"auto"`` values from the run -> check the batch arithmetic (``batch``) -> validate the
ZeRO/bf16/fp16 sections with DeepSpeed's models -> check the precision against the device and the
combinations DeepSpeed rejects -> check optimizer and scheduler (``optim``) -> build DeepSpeed's own
``DeepSpeedConfig`` as a last net. Every problem is a one-line ``UserError``
naming the file and the dotted key. The result is a plain dict, stored verbatim in the record.

``"auto"`` rules follow the HF Trainer's DeepSpeed integration
(transformers/integrations/deepspeed.py, ``HfTrainerDeepSpeedConfig.trainer_config_process``).
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from dataclasses import dataclass
from typing import Any

from ds_bench.config.deepspeed import optim
from ds_bench.config.deepspeed import sections as ds_sections
from ds_bench.config.deepspeed.batch import resolve_batch
from ds_bench.config.deepspeed.keys import section_keys
from ds_bench.errors import UserError


@dataclass(frozen=True)
class RunContext:
    """What the run knows that ``"auto"`` values and checks depend on."""

    world_size: int
    device_type: str
    lr: float
    steps: int
    warmup: int
    micro_batch: int | None = None
    hidden_size: int | None = None


def read(path: str, overrides: tuple[str, ...]) -> dict:
    """The config as the user gave it (pure but for reading ``path``): the JSON (errors name the line and
    column), ``--set`` applied, legacy top-level spellings renamed. What the legality table reads a run's stage,
    offload and precision from (``derive.axes_of``) before ``resolve`` finishes it, so a run reads its file once."""
    return ds_sections.rename_aliases(apply_overrides(load_json(path), tuple(overrides)), path)


def prepare(path: str, overrides: tuple[str, ...], ctx: RunContext) -> dict:
    """``read`` then ``resolve``: a config file as ``deepspeed.initialize`` gets it."""
    return resolve(read(path, overrides), ctx, path)


def resolve(cfg: dict, ctx: RunContext, path: str) -> dict:
    """A ``read`` config resolved for one run (module docstring: keys, degrees, ``"auto"``, batch, sections
    normalised once with DeepSpeed's models, precision, optimizer)."""
    check_unknown_keys(cfg, path)
    ds_sections.check_flag_keys(cfg, path)
    cfg = ds_sections.normalize_sections(resolve_auto(cfg, ctx, path), path)
    check_precision(cfg, ctx.device_type, path)
    ds_sections.check_combinations(cfg, path)
    optim.check_optimizer(cfg, path)
    optim.check_scheduler(cfg, path)
    ds_sections.check_with_deepspeed(cfg, path)
    return cfg


def portable(ds_cfg: dict) -> dict:
    """A resolved config to carry from a measurement to a job of any size: the per-device micro-batch
    and the accumulation kept, ``train_batch_size`` left out (DeepSpeed derives it as micro-batch x
    accumulation x world size), so the same file runs on 1 rank or on 16 nodes."""
    return {key: value for key, value in ds_cfg.items() if key != "train_batch_size"}


def write_config(path: str, ds_cfg: dict) -> None:
    """Write a DeepSpeed JSON config whole (a temporary file renamed over ``path``)."""
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(ds_cfg, f, indent=2)
    os.replace(path + ".tmp", path)


def load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"{path}: cannot read DeepSpeed config ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}); a DeepSpeed config is JSON") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    if not isinstance(cfg, dict):
        raise UserError(f"{path}: a DeepSpeed config must be a JSON object, got {type(cfg).__name__}")
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=VALUE`` -> (["a", "b", "c"], VALUE parsed as JSON, else kept as a string)."""
    key, sep, raw = text.partition("=")
    parts = key.split(".")
    if not sep or not all(p.strip() for p in parts):
        raise UserError(f"--set {text!r}: expected KEY=VALUE with a dotted DeepSpeed key, "
                        "e.g. --set zero_optimization.stage=3")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    return [p.strip() for p in parts], value


def apply_overrides(cfg: dict, overrides: tuple[str, ...]) -> dict:
    out = copy.deepcopy(cfg)
    for text in overrides:
        parts, value = parse_override(text)
        node = out
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"--set {text!r}: {'.'.join(parts[:i + 1])} is not a JSON object")
        node[parts[-1]] = value
    return out


def unknown_keys(cfg: dict) -> list[str]:
    """Dotted unknown keys, each with a 'did you mean' hint when one is close."""
    found = []
    for section, allowed in section_keys().items():
        node = _get(cfg, section)
        if not isinstance(node, dict):
            continue
        for key in node:
            if key not in allowed:
                dotted = ".".join((*section, key))
                near = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.75)
                found.append(dotted + (f" (did you mean {near[0]}?)" if near else ""))
    return found


def check_unknown_keys(cfg: dict, path: str) -> None:
    bad = unknown_keys(cfg)
    if bad:
        raise UserError(f"{path}: unknown DeepSpeed key{'s' if len(bad) > 1 else ''} "
                        f"{'; '.join(bad)}: DeepSpeed would ignore or reject it")


def resolve_auto(cfg: dict, ctx: RunContext, path: str) -> dict:
    out = copy.deepcopy(cfg)
    resolve_batch(out, ctx.world_size, ctx.micro_batch, path)
    hidden = ctx.hidden_size
    rules = {
        ("gradient_clipping",): 1.0,
        ("optimizer", "params", "lr"): ctx.lr,
        ("optimizer", "params", "adam_lr"): ctx.lr,  # Muon's AdamW half (--optimizer muon)
        ("optimizer", "params", "betas"): [0.9, 0.999],
        ("optimizer", "params", "eps"): 1e-8,
        ("optimizer", "params", "weight_decay"): 0.0,
        ("scheduler", "params", "warmup_min_lr"): 0.0,
        ("scheduler", "params", "warmup_max_lr"): ctx.lr,
        ("scheduler", "params", "warmup_num_steps"): max(1, ctx.warmup),  # DeepSpeed's WarmupLR refuses 0
        ("scheduler", "params", "total_num_steps"): ctx.steps,
        ("bf16", "enabled"): True,
        ("fp16", "enabled"): False,
        ("zero_optimization", "reduce_bucket_size"): hidden * hidden if hidden else int(5e8),
        ("zero_optimization", "stage3_prefetch_bucket_size"): int(0.9 * hidden * hidden) if hidden else int(5e7),
        ("zero_optimization", "stage3_param_persistence_threshold"): 10 * hidden if hidden else int(1e5),
    }
    for key, value in rules.items():
        if _get(out, key) == "auto":
            _get(out, key[:-1])[key[-1]] = value
    left = [key for key in _find_auto(out) if tuple(key.split(".")) not in ds_sections.deepspeed_auto_keys()]
    if left:
        raise UserError(f"{path}: no rule to resolve \"auto\" for {', '.join(left)}; give a value")
    return out


def check_precision(cfg: dict, device_type: str, path: str) -> None:
    """Precision against the device (after ``ds_sections`` made bfloat16 -> bf16 and coerced values)."""
    fp16 = _get(cfg, ("fp16", "enabled")) is True
    bf16 = _get(cfg, ("bf16", "enabled")) is True
    if fp16 and bf16:
        raise UserError(f"{path}: fp16.enabled and bf16.enabled are both true; choose one")
    if fp16 and device_type == "cpu":
        raise UserError(f"{path}: fp16 is not supported on CPU (DeepSpeed: 'Type fp16 is not supported "
                        "on your device'); use bf16: --set fp16.enabled=false --set bf16.enabled=true")


def precision_of(cfg: dict) -> str:
    if _get(cfg, ("bf16", "enabled")) is True:
        return "bf16"
    if _get(cfg, ("fp16", "enabled")) is True:
        return "fp16"
    return "fp32"


def zero_stage(cfg: dict) -> int:
    return int(_get(cfg, ("zero_optimization", "stage")) or 0)


def _get(cfg: dict, key: tuple[str, ...]) -> Any:
    node: Any = cfg
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _find_auto(node: Any, prefix: str = "") -> list[str]:
    if isinstance(node, dict):
        return [k for key, v in node.items() for k in _find_auto(v, f"{prefix}{key}.")]
    return [prefix.rstrip(".")] if node == "auto" else []
