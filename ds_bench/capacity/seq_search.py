"""``--scale seq``: which sequence length to probe next, and what the probes say (pure).

Memory grows with the sequence, so "trains" is monotone in it, as along a family: every length below one
that ran fits, every length above one that ran out of memory does not. The search probes the start length
first (it calibrates the memory prediction and proves the layout runs at all), doubles while the lengths
fit (up to the maximum, which it probes as it is when doubling would pass it), then bisects between the
longest that fit (``low``) and the shortest that did not (``high``: ran out of memory, timed out or crashed,
or predicted not to fit) until they are at most one step apart: about log2(maximum / start) doublings and
log2((high - low) / step) bisections. Every length probed is a multiple of ``multiple`` (every layout's
sequence-parallel degree: each rank of a group holds an equal slice), so the step is the granularity
rounded up to a multiple of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ds_bench.capacity.search import FITS, Answer


@dataclass(frozen=True)
class Lengths:
    """Where a sequence search starts, how far it may go, and how finely it ends."""

    start: int
    """The first length probed (``--seq-len``); a multiple of ``multiple``."""
    maximum: int
    """The longest length probed (``--max-seq-len``; rounded down to a multiple of ``multiple``)."""
    granularity: int
    """The bisection ends when the longest that fit and the shortest that did not are this close
    (``--seq-granularity``)."""
    multiple: int = 1
    """Every length probed is a multiple of it: the least common multiple of the layouts' sequence-parallel degrees."""

    @property
    def step(self) -> int:
        return math.lcm(self.granularity, self.multiple)

    @property
    def top(self) -> int:
        return max(self.start, self.maximum // self.multiple * self.multiple)


def bounds(known: dict[int, str]) -> tuple[int | None, int | None]:
    """(low, high): the longest length that fits (None: none) and the shortest above it that does not
    (None: none known)."""
    low = max((t for t, s in known.items() if s == FITS), default=None)
    high = min((t for t, s in known.items() if s != FITS and (low is None or t > low)), default=None)
    return low, high


def next_length(lengths: Lengths, known: dict[int, str]) -> int | None:
    """The length to run next, or None when the answer is known. ``known`` maps each length tried (or
    predicted) to its status: ``ok`` fits, anything else does not."""
    if lengths.start not in known:
        return lengths.start
    low, high = bounds(known)
    if low is None:
        return None
    if high is None:
        nxt = min(2 * low, lengths.top)
        return nxt if nxt > low else None
    gap = high - low
    if gap <= lengths.step:
        return None
    return low + max(lengths.step, gap // 2 // lengths.step * lengths.step)


def answer(lengths: Lengths, known: dict[int, str]) -> Answer:
    """The longest length that trained, the next one and why it did not (``why``: ``oom``, ``predicted``,
    ``timeout``, ``crashed``); ``next`` None when the longest is the maximum."""
    low, high = bounds(known)
    if low is None:
        return Answer(None, lengths.start if lengths.start in known else None, known.get(lengths.start))
    if high is None:
        return Answer(low, None, None)
    return Answer(low, high, known[high])
