"""Flag values shared by the commands, parsed by pure functions: comma-separated lists, durations,
sizes, and DeepSpeed config names. Each raises a one-line error naming the flag (``UserError``;
``parse_size`` a ``ValueError`` its callers word for their flag).
"""

from __future__ import annotations

import math
import os
import re

from ds_bench.errors import UserError

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ds_configs")
_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
          "t": 2**40, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str) -> int:
    """``4GiB``, ``512MiB``, ``3G`` (binary), ``2GB`` (decimal) or plain bytes -> bytes (pure)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m and m.group(2).lower()
    if not m or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; expected e.g. 4GiB, 512MiB or a number of bytes")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{text!r}: a size must be > 0")
    return value


def parse_list(flag: str, text: str, allowed=None, kind=str) -> tuple:
    """``"a,b,a"`` -> ``(a, b)``: checked items, repeats dropped (pure)."""
    return tuple(dict.fromkeys(parse_items(flag, text, allowed, kind)))


def parse_items(flag: str, text: str, allowed=None, kind=str) -> list:
    """Every item of a comma-separated flag value, in order, each converted by ``kind`` and checked
    (an ``int`` without ``allowed`` must be >= 1); a one-line ``UserError`` naming the flag otherwise."""
    items = [t.strip() for t in text.split(",")]
    if not text.strip() or not all(items):
        raise UserError(f"{flag} {text!r}: expected a comma-separated list, e.g. {_example(flag)}")
    out = []
    for item in items:
        try:
            value = kind(item)
        except ValueError:
            raise UserError(f"{flag} {text!r}: {item!r} is not {'an integer' if kind is int else 'valid'}") from None
        if allowed is not None and value not in allowed:
            raise UserError(f"{flag} {text!r}: {item!r} is not one of {', '.join(map(str, allowed))}")
        if kind is int and allowed is None and value < 1:
            raise UserError(f"{flag} {text!r}: {item!r} must be a positive integer")
        out.append(value)
    return out


def _example(flag: str) -> str:
    return {"--stages": "0,1,2,3", "--offload": "none,optimizer", "--precision": "fp32,bf16",
            "--micro-batch": "1,2,4 or auto", "--grad-accum": "1,4", "--engines": "deepspeed,ddp,fsdp", "--ranks": "1,2,4", "--nodes": "1,2,4"
            }.get(flag, "a,b")


def parse_duration(flag: str, text: str) -> float:
    """``90s``, ``15m``, ``1h``, ``1d`` or plain seconds -> seconds (pure)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*", text or "")
    if not m:
        raise UserError(f"{flag} {text!r}: expected a duration such as 90s, 15m, 1h or 1d")
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if not math.isfinite(seconds) or seconds <= 0:
        raise UserError(f"{flag} {text!r}: must be more than 0 seconds")
    return seconds


def config_path(name: str) -> str:
    """A config as given when that file exists, else the one of that name in ds_configs/."""
    return name if os.path.isfile(name) else os.path.join(CONFIG_DIR, name)


def memory_cap(text: str | None, flag: str = "--cpu-mem-limit") -> int | None:
    """``--cpu-mem-limit SIZE`` of a command that launches runs (or another size ``flag``): bytes, or None when not
    given."""
    if text is None:
        return None
    try:
        return parse_size(text)
    except ValueError as e:
        raise UserError(f"{flag} {e}") from None
