"""The checks of ``RunConfig``'s flags against each other (``UserError`` naming the flag, before joining),
and the values they allow: engines and attention implementations. Shared with the commands that build
run flags (sweep, capacity, roofline, comm). ``cfg`` is a ``ds_bench.config.run_config.RunConfig`` (not
imported: it imports this module).
"""

from __future__ import annotations

import math
import os

from ds_bench.errors import UserError

ENGINES = ("deepspeed", "ddp", "fsdp")
"""What can train the model (``--engine``), from the same DeepSpeed config (``ds_bench.engines``)."""
ATTENTION = ("sdpa", "eager", "flash_attention_2")
"""``--attn``: HF transformers' attention implementations (``attn_implementation``); sdpa is
``F.scaled_dot_product_attention`` (flash / memory-efficient kernels where the device has them)."""


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


PIPELINE_CONFLICTS = {
    "breakdown": "--breakdown times the phases of each micro-step; a pipeline runs them all inside train_batch",
    "checkpoint": "--checkpoint with a pipeline is not measured yet",
    "resume": "--resume with a pipeline is not measured yet",
    "compile": "--compile with a pipeline is not measured yet (DeepSpeed's PipelineEngine runs stage by stage)",
    "model_path": "--model (pretrained weights) is not loaded into pipeline stages yet; use --size or --layers",
}
"""Flags a pipeline run refuses, and why."""


def check_pipeline_flags(cfg) -> None:
    """``--pipeline-stages``/``--partition`` against the other flags (the world size is checked in ``run.resolve``)."""
    stages = cfg.pipeline_stages
    if stages is None:
        _require(cfg.partition is None, "--partition needs --pipeline-stages (it splits layers over pipeline stages)")
        return
    _check_layout_flags(cfg, "--pipeline-stages", stages, "the pipeline is DeepSpeed's own engine (--engine deepspeed)",
                        PIPELINE_CONFLICTS)
    _require(cfg.attn != "eager", "--attn eager with --pipeline-stages: a stage's blocks get no attention mask, "
                                  "which only sdpa and flash_attention_2 apply causally; use --attn sdpa")
    check_partition(cfg.partition)


TENSOR_PARALLEL_CONFLICTS = {
    "pipeline_stages": "AutoTP does not combine with DeepSpeed's pipeline engine (DeepSpeed #7147); drop --pipeline-stages",
    "checkpoint": "--checkpoint with tensor parallelism is not measured yet",
    "resume": "--resume with tensor parallelism is not measured yet",
    "compile": "--compile with tensor parallelism is not measured yet (DeepSpeed has its own AutoTP compile pass)",
    "breakdown": "--breakdown with tensor parallelism is not measured yet",
}
"""Flags a tensor-parallel run refuses, and why."""


def check_tensor_parallel_flags(cfg) -> None:
    """``--tensor-parallel`` against the other flags (the world size and the model in ``run.resolve``)."""
    size = cfg.tensor_parallel
    if size is None:
        return
    _check_layout_flags(cfg, "--tensor-parallel", size, "tensor parallelism is DeepSpeed's AutoTP here "
                        "(--engine deepspeed)", TENSOR_PARALLEL_CONFLICTS)


def _check_layout_flags(cfg, flag: str, degree: int, engine_why: str, conflicts: dict[str, str]) -> None:
    """A model-parallel layout flag: a positive degree, DeepSpeed's engine, none of the flags it refuses."""
    _require(degree >= 1, f"{flag} must be a positive integer, got {degree}")
    _require(cfg.engine == "deepspeed", f"--engine {cfg.engine} with {flag}: {engine_why}")
    for name, why in conflicts.items():
        _require(not getattr(cfg, name), f"{flag}: {why}")


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
