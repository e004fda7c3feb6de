"""The checks of ``RunConfig``'s flag values (``UserError`` naming the flag, before joining): engines,
attention implementations, compile, timeouts (each parallel degree checks its own flags:
``ds_bench.config.degrees``). Which layouts are refused is the
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


def check_timeout(flag: str, seconds: float) -> None:
    """Every distributed wait is bounded: a timeout must be a finite, positive number of seconds (a ``RunConfig``
    built in code; a flag's own value is ``parsers.parse_duration``'s)."""
    _require(math.isfinite(seconds) and seconds > 0, f"{flag} must be a finite number of seconds > 0, got {seconds}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)
