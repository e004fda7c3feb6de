"""Which family member to probe next, and what the probes say (pure).

Model memory grows with the member, so "trains" is monotone along the family: every member below
one that ran fits, every member above one that ran out of memory does not. The search keeps the
largest member known to fit (``low``) and the smallest known not to (``high``: ran out of memory,
timed out or crashed, or predicted not to fit), probes the smallest member first (it calibrates the
memory prediction and proves the layout runs at all), then bisects between them until they are
neighbours: about log2(n) probes for n members.
"""

from __future__ import annotations

from dataclasses import dataclass

FITS = "ok"
PREDICTED = "predicted"
"""A member the calibrated prediction puts above the memory: not run (``--no-prune`` runs it)."""


@dataclass(frozen=True)
class Answer:
    largest: int | None
    """Index of the largest member that trained; None when not even the smallest did."""
    next: int | None
    """Index of the member above it; None when the largest is the family's last."""
    why: str | None
    """What became of ``next``: ``oom``, ``predicted``, ``timeout``, ``crashed``..."""


def bounds(n: int, known: dict[int, str]) -> tuple[int, int]:
    """(low, high): the largest index that fits (-1: none) and the smallest above it that does not
    (n: none known)."""
    low = max((i for i, s in known.items() if s == FITS), default=-1)
    high = min((i for i, s in known.items() if s != FITS and i > low), default=n)
    return low, high


def next_probe(n: int, known: dict[int, str]) -> int | None:
    """The member to run next, or None when the answer is known."""
    if n == 0:
        return None
    if 0 not in known:
        return 0
    low, high = bounds(n, known)
    if low < 0 or high - low <= 1:
        return None
    return (low + high) // 2


def answer(n: int, known: dict[int, str]) -> Answer:
    low, high = bounds(n, known)
    if low < 0:
        return Answer(None, 0 if n else None, known.get(0))
    if high >= n:
        return Answer(low, None, None)
    return Answer(low, high, known[high])
