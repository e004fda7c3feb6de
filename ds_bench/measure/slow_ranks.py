"""Slow-rank detection: which ranks compute markedly slower than the median rank.

Owns the rule only; the measurement is ``ds_bench.measure.loop`` (compute time = forward + autograd
backward, excluding the gradient reduction where fast ranks wait) and the per-rank medians are
``ds_bench.measure.metrics.per_rank_compute``. A rank is slow when its compute time is more than
``threshold_pct`` percent above the median over ranks (strictly: exactly at the threshold is not
slow). With two ranks the median is their mean, so a rank twice as slow as the other shows as
33% slower, and no rank can show 100% or more. What the record keeps of a slow rank is its block
``ds_bench.record.run_blocks.SlowRank``; the summary line is ``ds_bench.report.summary``'s.
"""

from __future__ import annotations

import statistics

FIELDS = ("rank", "host", "compute_ms", "vs_median_pct")
"""A slow rank as ``find`` gives it; ``vs_median_pct``: how much slower than the median rank, in percent
(25.0: 1.25 x the median)."""


def find(per_rank: list[tuple[int, str, float]], threshold_pct: float) -> list[tuple[int, str, float, float]]:
    """Ranks of ``[(rank, host, compute_ms)]`` slower than (1 + threshold_pct/100) x the median, by rank, as
    ``FIELDS`` tuples."""
    if not per_rank:
        return []
    median = statistics.median(ms for _, _, ms in per_rank)
    if median <= 0:  # nothing measured: no basis for a comparison
        return []
    limit = median * (1 + threshold_pct / 100)
    return [(rank, host, ms, (ms / median - 1) * 100)
            for rank, host, ms in sorted(per_rank) if ms > limit]


def from_metrics(metrics: dict, threshold_pct: float) -> list[dict]:
    """The record's ``slow_ranks`` list from a run's metrics (empty without per-rank compute times)."""
    times, hosts = metrics.get("compute_ms_per_rank"), metrics.get("host_per_rank")
    if not times:
        return []
    return [dict(zip(FIELDS, s)) for s in find(list(zip(range(len(times)), hosts, times)), threshold_pct)]
