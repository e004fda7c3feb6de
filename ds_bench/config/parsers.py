"""Flag values shared by the commands, parsed by pure functions: comma-separated lists, DeepSpeed config
names, and every value with a unit: counts, sizes in bytes, memory caps, durations. Each raises a one-line
``UserError`` naming the flag and what is expected; ``flag_type`` makes one an argparse ``type``.

Units, one rule for every command (docs/README.md, "Units"):

- a count (tokens, sequence lengths, ``--max-micro-batch``): a whole number, or one with ``k``, ``M`` or ``G``,
  2^10-based as the field counts tokens (``8k`` = 8,192, ``4M`` = 4,194,304); a byte unit (``4MB``) is refused;
- a size in bytes: ``KiB MiB GiB TiB`` and the bare letters ``K M G T`` are 2^10-based, ``KB MB GB TB`` 10^3-based,
  ``B`` or no unit bytes; a memory cap (``--cpu-mem-limit``, ``--device-memory``) needs its unit and at least
  ``MIN_MEMORY_BYTES`` (a bare ``512`` is no cap a rank can start under);
- a duration: a number with ``s``, ``m``, ``h`` or ``d``; a bare number is refused (seconds and Slurm's minutes are
  both plausible readings of ``--timeout 20``).
"""

from __future__ import annotations

import functools
import math
import os
import re

from ds_bench.errors import UserError

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "ds_configs")


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


def config_path(name: str) -> str:
    """A config as given when that file exists, else the one of that name in ds_configs/."""
    return name if os.path.isfile(name) else os.path.join(CONFIG_DIR, name)


MIN_MEMORY_BYTES = 64 * 2**20
"""The least memory cap taken: below it no rank starts (Python, torch and the process group hold more)."""
BINARY = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
COUNT_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}
COUNT_LETTERS = {"k": "k", "m": "M", "g": "G"}
BYTE_UNITS = {"": 1, "b": 1, **BINARY, **{f"{p}ib": v for p, v in BINARY.items()},
              **{f"{p}b": 1000 ** n for n, p in enumerate("kmgt", start=1)}}
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER_AND_UNIT = re.compile(r"\s*([-+]?[0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


def flag_type(parse, flag: str):
    """``parse`` (a ``parse_*(flag, text)`` of this module) as the argparse ``type`` of ``flag``: its
    ``UserError`` passes argparse by, one line naming the flag."""
    return functools.partial(parse, flag)


def _number_and_unit(text) -> tuple[float, str] | None:
    """``" 1.5 GiB"`` -> ``(1.5, "gib")``; None when ``text`` is not a number with an optional unit."""
    m = _NUMBER_AND_UNIT.fullmatch(str(text or ""))
    return (float(m.group(1)), m.group(2).lower()) if m else None


def parse_count(flag: str, text: str) -> int:
    """``8192``, ``8k``, ``4M``, ``1G`` -> a positive whole count, k/M/G 2^10-based (pure)."""
    parsed = _number_and_unit(text)
    if parsed and parsed[1] in BYTE_UNITS and parsed[1] not in COUNT_UNITS:
        raise UserError(f"{flag} {text!r}: a count takes no byte unit; give {_as_count(*parsed)}")
    if not parsed or parsed[1] not in COUNT_UNITS:
        raise UserError(f"{flag} {text!r}: expected a count such as 8192, 8k or 4M (k, M, G = 2^10, 2^20, 2^30)")
    value = parsed[0] * COUNT_UNITS[parsed[1]]
    if value != int(value):
        raise UserError(f"{flag} {text!r} is {value:g}: expected a whole number")
    if value < 1:
        raise UserError(f"{flag} must be a positive integer, got {str(text).strip()}")
    return int(value)


def _as_count(number: float, unit: str) -> str:
    """What a count given with a byte unit (``4MB``) may have meant: ``4M (= 4,194,304 ...) or ... 4000000``."""
    letter = unit[0] if unit[0] in "kmg" else ""
    if not letter:
        return "a plain number"
    return (f"{number:g}{COUNT_LETTERS[letter]} (= {number * COUNT_UNITS[letter]:,.0f}: k, M, G are 2^10-based) or a "
            f"plain number such as {number * BYTE_UNITS[letter + 'b']:.0f}")


def parse_bytes(flag: str, text: str) -> int:
    """``4GiB``, ``512MiB``, ``3G`` (2^10-based), ``2GB`` (10^3-based), ``64B`` or a plain number of bytes ->
    bytes > 0 (pure)."""
    parsed = _number_and_unit(text)
    if not parsed or parsed[1] not in BYTE_UNITS:
        raise UserError(f"{flag} {text!r}: expected a size such as 4GiB, 512MiB, 64KB or a number of bytes "
                        "(KiB, MiB, GiB and K, M, G are 2^10-based; KB, MB, GB 10^3-based)")
    value = int(parsed[0] * BYTE_UNITS[parsed[1]])
    if value <= 0:
        raise UserError(f"{flag} {text!r}: a size must be > 0")
    return value


def parse_memory(flag: str, text: str) -> int:
    """A memory cap: ``parse_bytes`` with its unit given and at least ``MIN_MEMORY_BYTES`` (pure)."""
    parsed = _number_and_unit(text)
    if parsed and not parsed[1]:
        number = str(text).strip()
        raise UserError(f"{flag} {number}: give a unit, e.g. {number}GiB or {number}MiB (a bare number is not "
                        "taken as bytes)")
    value = parse_bytes(flag, text)
    if value < MIN_MEMORY_BYTES:
        raise UserError(f"{flag} {text!r} is {value:,} bytes: below {MIN_MEMORY_BYTES // 2**20} MiB no rank "
                        "starts; give e.g. 4GiB")
    return value


def parse_duration(flag: str, text: str) -> float:
    """``90s``, ``15m``, ``1.5h``, ``1d`` -> seconds > 0; a bare number is refused (pure)."""
    parsed = _number_and_unit(text)
    if parsed and not parsed[1]:
        number = str(text).strip()
        raise UserError(f"{flag} {number}: give a unit, e.g. {number}s or {number}m (s, m, h, d)")
    if not parsed or parsed[1] not in DURATION_UNITS:
        raise UserError(f"{flag} {text!r}: expected a duration such as 90s, 15m, 1h or 1d")
    seconds = parsed[0] * DURATION_UNITS[parsed[1]]
    if not math.isfinite(seconds) or seconds < 0.001:
        raise UserError(f"{flag} {text!r}: must be at least 1 ms")
    return seconds


def duration_text(seconds: float) -> str:
    """``900.0`` -> ``"900s"``: a duration as ``parse_duration`` reads it back (never ``1e+06``, which it refuses)."""
    return f"{seconds:.6f}".rstrip("0").rstrip(".") + "s"
