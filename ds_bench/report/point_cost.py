"""What a study's points cost beside what they measure: the median of each phase of the jobs' wall time
(``PointTime``, split by ``ds_bench.jobs.point_time``) over a study's ok points, as a small table for the sweep's
summary (terminal and markdown)."""

from __future__ import annotations

import statistics

from tabulate import tabulate

from ds_bench.jobs.point_time import PHASES
from ds_bench.record.schema import SweepPointRecord

LABELS = {"process_group": "process group", "warmup": "warm-up"}


def median_split(records: list[SweepPointRecord]) -> dict[str, float] | None:
    """Each phase's median (s) over the records with a split, and ``wall``; None when none has one (pure)."""
    splits = [r.time_split for r in records if r.time_split is not None]
    if not splits:
        return None
    out = {}
    for name in (*PHASES, "wall"):
        values = [v for v in (getattr(s, f"{name}_s") for s in splits) if v is not None]
        if values:
            out[name] = statistics.median(values)
    return out


def point_cost(records: list[SweepPointRecord], fmt: str = "simple") -> str | None:
    """The heading line and the one-row table: per-phase medians, the wall range and the measured share of the ok
    attempts' job time (failed jobs are not in it); None when no record has a split."""
    medians = median_split(records)
    if medians is None:
        return None
    splits = [r.time_split for r in records if r.time_split is not None]
    walls = [s.wall_s for s in splits if s.wall_s is not None]
    measured = sum(s.measured_s or 0.0 for s in splits)
    heading = (f"where a point's time goes (s, median over {len(splits)} ok attempt(s); wall {min(walls):.1f}-"
               f"{max(walls):.1f} s each, {_minutes(sum(walls))} in all, {measured / sum(walls):.0%} of it in measured "
               f"steps)")
    names = [n for n in (*PHASES, "wall") if n in medians]
    table = tabulate([[medians[n] for n in names]], headers=[LABELS.get(n, n) for n in names], tablefmt=fmt,
                     floatfmt=".1f")
    return f"{heading}\n{table}"


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s" if seconds >= 60 else f"{seconds:.0f} s"
