"""Slurm's compressed host lists and per-node task counts.

``expand_nodelist`` turns ``node[01-04,07]``, ``a[1-2],b[3,5]``, ``gpu-[1-2]-ib`` or
``r[1-2]n[01-02]`` into plain host names, keeping zero padding; several bracket groups in one name
expand as a cartesian product with the leftmost group varying slowest, as ``scontrol show
hostnames`` prints them. ``tasks_per_node`` expands ``SLURM_TASKS_PER_NODE`` (``4(x2),3``).
"""

from __future__ import annotations

import itertools
import re

from ds_bench.errors import UserError

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")
_TASKS = re.compile(r"(\d+)(?:\(x(\d+)\))?")
_NAME_CHARS = re.compile(r"[A-Za-z0-9._-]*")


def _split_top_level(text: str) -> list[str] | None:
    """Split on commas outside brackets; None when brackets are unbalanced or nested."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        if depth not in (0, 1):
            return None
    if depth != 0:
        return None
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str) -> list[str] | None:
    """``01-03,7`` -> ``['01', '02', '03', '7']``; None when malformed."""
    values: list[str] = []
    for item in body.split(","):
        match = _RANGE.fullmatch(item)
        if not match:
            return None
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            return None
        width = len(lo_text)
        values.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return values


def _expand_name(item: str) -> list[str] | None:
    """Expand one top-level item, e.g. ``r[1-2]n[01-02]``; None when malformed."""
    pieces = re.split(r"\[([^\]]*)\]", item)
    # re.split alternates literal text and bracket bodies: lit, body, lit, body, ..., lit.
    literals, bodies = pieces[0::2], pieces[1::2]
    if not item or not all(_NAME_CHARS.fullmatch(lit) for lit in literals):
        return None
    choices: list[list[str]] = []
    for lit, body in itertools.zip_longest(literals, bodies):
        choices.append([lit])
        if body is not None:
            expanded = _expand_ranges(body)
            if expanded is None:
                return None
            choices.append(expanded)
    return ["".join(parts) for parts in itertools.product(*choices)]


def expand_nodelist(s: str, var: str = "SLURM_NODELIST") -> list[str]:
    """Expand a Slurm host list; ``var`` names the variable it came from, for error messages."""
    items = _split_top_level(s.strip())
    hosts: list[str] = []
    for item in items or [None]:
        expanded = _expand_name(item) if item is not None else None
        if not expanded or not all(expanded):
            raise UserError(
                f"{var}={s!r}: not a Slurm host list; expected e.g. 'node01' or 'node[01-04,07]'"
            )
        hosts.extend(expanded)
    return hosts


def tasks_per_node(s: str, var: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand ``4(x2),3`` into ``[4, 4, 3]``."""
    counts: list[int] = []
    for item in s.strip().split(","):
        match = _TASKS.fullmatch(item)
        if not match or match.group(2) == "0":
            raise UserError(f"{var}={s!r}: not a task count list; expected e.g. '4(x2),3'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
