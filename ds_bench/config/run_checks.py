"""The checks of ``RunConfig``'s flag values (``UserError`` naming the flag, before joining): engines,
attention implementations, compile, degrees, partitions, timeouts. Which layouts are refused is the
legality table's (``ds_bench.config.legality``), checked by the run once its config and world are known.
``cfg`` is a ``ds_bench.config.run_config.RunConfig`` (not imported: it imports this module).
"""

from __future__ import annotations

import math
import os

from ds_bench.config.layout import ATTENTION, ENGINES
from ds_bench.errors import UserError


def check_attention(name: str | None) -> None:
    """``--attn`` names one of ``ATTENTION``, and its kernel package is installed (checked before joining)."""
    if name is None:
        return
    _require(name in ATTENTION, f"--attn {name!r} is unknown; known: {', '.join(ATTENTION)}")
    if name == "flash_attention_2":
        import importlib.util

        _require(importlib.util.find_spec("flash_attn") is not None,
                 "--attn flash_attention_2 needs the flash-attn package, which is not installed here "
                 "(pip install flash-attn on a CUDA machine), or use --attn sdpa")


def check_compile(cfg) -> None:
    """``--compile`` needs a warm-up step to compile in and dynamo switched on (checked before joining)."""
    if not cfg.compile:
        return
    _require(cfg.warmup >= 1, "--compile needs --warmup 1 or more: the first step compiles, and a compile "
                              "inside the measured steps fails the run")
    check_compile_environment("--compile")


def check_compile_environment(flag: str) -> None:
    """Dynamo is on: with TORCHDYNAMO_DISABLE set, torch.compile silently runs eager."""
    _require(os.environ.get("TORCHDYNAMO_DISABLE", "0").lower() in ("", "0", "false"),
             f"{flag} with TORCHDYNAMO_DISABLE set in the environment: torch.compile would silently run eager; "
             "unset it")


def check_engine(name: str) -> None:
    """``--engine`` must name one of ``ENGINES``."""
    if name not in ENGINES:
        raise UserError(f"--engine {name!r} is unknown; known: {', '.join(ENGINES)}")


def check_pipeline_flags(cfg) -> None:
    """``--pipeline-stages``/``--partition`` values (what they may not combine with: ``config.legality``)."""
    stages = cfg.pipeline_stages
    if stages is None:
        _require(cfg.partition is None, "--partition needs --pipeline-stages (it splits layers over pipeline stages)")
        return
    _require(stages >= 1, f"--pipeline-stages must be a positive integer, got {stages}")
    check_partition(cfg.partition)


def check_tensor_parallel_flags(cfg) -> None:
    """``--tensor-parallel``'s value (what it may not combine with: ``config.legality``)."""
    size = cfg.tensor_parallel
    _require(size is None or size >= 1, f"--tensor-parallel must be a positive integer, got {size}")


def check_partition(method: str | None) -> None:
    """``parameters``, ``uniform`` or ``type:REGEX`` (a regular expression over layer class names)."""
    if method is None or method in ("parameters", "uniform"):
        return
    _require(method.startswith("type:") and method[5:], f"--partition {method!r}: expected parameters, uniform "
                                                         "or type:REGEX (e.g. type:GPT2Block)")
    import re

    try:
        re.compile(method[5:])
    except re.error as e:
        raise UserError(f"--partition {method!r}: not a regular expression ({e})") from None


def check_timeout(flag: str, seconds: float) -> None:
    """Every distributed wait is bounded: a timeout must be a finite, positive number of seconds."""
    _require(math.isfinite(seconds) and seconds > 0, f"{flag} must be a finite number of seconds > 0, got {seconds}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


MOE_PATHS = ("auto", "autoep", "moe-layer", "hf")
"""``--moe-path`` (``ds_bench.engines.expert_parallel.PATHS``)."""


def check_moe_flags(cfg) -> None:
    """The moe flags' own values (against the model's experts: ``ds_bench.engines.expert_parallel.resolve``)."""
    for flag, value in (("--expert-parallel", cfg.expert_parallel), ("--experts", cfg.experts), ("--top-k", cfg.top_k)):
        _require(value is None or value >= 1, f"{flag} must be a positive integer, got {value}")
    _require(math.isfinite(cfg.capacity_factor) and cfg.capacity_factor >= 0,
             f"--capacity-factor must be a finite number >= 0 (0: no token dropping), got {cfg.capacity_factor}")
    weight = cfg.aux_loss_weight
    _require(weight is None or (math.isfinite(weight) and weight >= 0),
             f"--aux-loss-weight must be a finite number >= 0, got {weight}")
    _require(cfg.moe_path in MOE_PATHS, f"--moe-path {cfg.moe_path!r}: expected {', '.join(MOE_PATHS)}")
    moe_flags = [f for f, v in (("--expert-parallel", cfg.expert_parallel), ("--experts", cfg.experts),
                                ("--top-k", cfg.top_k), ("--aux-loss-weight", cfg.aux_loss_weight)) if v is not None]
    moe_flags += ["--capacity-factor"] if cfg.capacity_factor else []
    moe_flags += ["--moe-path"] if cfg.moe_path != "auto" else []
    _require(not moe_flags or cfg.workload == "moe",
             f"{'/'.join(moe_flags)}: workload {cfg.workload} has no experts (moe has)")
    engine = getattr(cfg, "engine", "deepspeed")  # a study's flags have none: its points' engines are an axis
    if engine != "deepspeed":  # DDP and FSDP train HF's own blocks: no capacity, no path to choose
        _require(not cfg.capacity_factor, f"--capacity-factor with --engine {engine}: HF's own MoE blocks, "
                                          "which DDP and FSDP train, drop no tokens; the capacity is DeepSpeed's MoE "
                                          "layer's (--engine deepspeed)")
        _require(cfg.moe_path == "auto", f"--moe-path {cfg.moe_path} with --engine {engine}: DDP and FSDP "
                                         "train HF's own MoE blocks; the paths are DeepSpeed's (--engine deepspeed)")
