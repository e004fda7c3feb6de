"""The sweep's verdict, pure: one row per point from its records, the points ranked, and the
recommendation with the reason when there is none.

Owns the arithmetic (over the *ok* repeats of a point; the latest record per (key, repeat) wins):
- throughput: median, min, max; ``spread % = (max - min) / median * 100``;
- ``CV % = s / mean * 100`` with ``s`` the *sample* standard deviation (n - 1), None under 2 repeats;
  a point is ``noisy`` when ``CV % > 5``;
- ``headroom % = (capacity - peak) / capacity * 100`` (peak: max over ok repeats, per rank);
- ``prediction ratio = predicted / measured`` peak memory (> 1: the prediction was generous);
- ``diff % = (median - baseline median) / baseline median * 100``;
- ties: two points are equal when their medians differ by at most ``tie %`` of the faster one's
  median, or by at most the spread % of either when their ranges of repeats also overlap.
Presentation (tables, figures) lives in ``table`` and ``plots``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from ds_bench.config.layout import Layout
from ds_bench.jobs.outcome import was_busy
from ds_bench.record.schema import SweepPointRecord

GIB = 2**30
NOISY_CV_PCT = 5.0


@dataclass(frozen=True)
class PointRow:
    point: Layout
    key: str
    status: str  # ok if any repeat ran ok, else the latest record's status
    reason: str | None
    repeats: int  # attempts counted: the latest one per repeat index
    repeats_ok: int
    throughput_median: float | None
    throughput_min: float | None
    throughput_max: float | None
    cv_pct: float | None
    noisy: bool
    peak_mem_bytes: int | None
    predicted_mem_bytes: int | None
    capacity_bytes: int | None
    headroom_pct: float | None
    prediction_ratio: float | None
    busy: bool
    unit: str | None = None
    run_id: str | None = None  # of the median ok repeat, like log and ds_config
    log: str | None = None
    ds_config: dict | None = field(default=None, compare=False)
    bubble: float | None = None  # pipeline points, of the median ok repeat: measured, and the schedule's
    schedule_bubble: float | None = None
    loss_last: float | None = None  # the median ok repeat's loss at its last step
    steps: int | None = None  # how many steps its loss curve has

    @property
    def ran_ok(self) -> bool:
        return self.status == "ok" and self.throughput_median is not None

    @property
    def spread_pct(self) -> float:
        if not self.ran_ok or not self.throughput_median:
            return 0.0
        return (self.throughput_max - self.throughput_min) / self.throughput_median * 100


def latest_attempts(records: list[SweepPointRecord]) -> dict[str, list[SweepPointRecord]]:
    """Per key, in first-seen order, the latest record of each repeat (file order: a re-run of an
    attempt supersedes it), ordered by when that latest record was written; other kinds are ignored."""
    by_key: dict[str, dict[int, tuple[int, SweepPointRecord]]] = {}
    for i, r in enumerate(records):
        if isinstance(r, SweepPointRecord):
            by_key.setdefault(r.key, {})[r.repeat] = (i, r)
    return {key: [r for _, r in sorted(repeats.values(), key=lambda e: e[0])] for key, repeats in by_key.items()}


def _last_known(attempts: list[SweepPointRecord], name: str):
    return next((getattr(a, name) for a in reversed(attempts) if getattr(a, name) is not None), None)


def _median_attempt(ok: list[SweepPointRecord]) -> SweepPointRecord:
    """The ok repeat at the median (the lower middle one for an even count)."""
    return sorted(ok, key=lambda a: a.throughput)[(len(ok) - 1) // 2]


def _failed_repeats_reason(attempts: list[SweepPointRecord]) -> str | None:
    failed = [a for a in attempts if a.status != "ok"]
    if not failed:
        return None
    last = failed[-1]
    return f"{len(failed)} of {len(attempts)} repeats {last.status}" + (f": {last.reason}" if last.reason else "")


def summarize_point(attempts: list[SweepPointRecord], cores: int | None = None) -> PointRow:
    ok = [a for a in attempts if a.status == "ok" and a.throughput is not None]
    latest = attempts[-1]
    tput = [a.throughput for a in ok]
    median = statistics.median(tput) if tput else None
    cv = statistics.stdev(tput) / statistics.fmean(tput) * 100 if len(tput) >= 2 and median else None
    peaks = [a.peak_mem_bytes for a in ok if a.peak_mem_bytes is not None]
    peak = max(peaks) if peaks else None
    predicted, capacity = _last_known(attempts, "predicted_mem_bytes"), _last_known(attempts, "capacity_bytes")
    chosen = _median_attempt(ok) if ok else latest
    return PointRow(
        point=Layout.from_dict(latest.point), key=latest.key,
        status="ok" if ok else latest.status,
        reason=_failed_repeats_reason(attempts) if ok else latest.reason,
        repeats=len(attempts), repeats_ok=len(ok),
        throughput_median=median, throughput_min=min(tput, default=None), throughput_max=max(tput, default=None),
        cv_pct=cv, noisy=cv is not None and cv > NOISY_CV_PCT,
        peak_mem_bytes=peak, predicted_mem_bytes=predicted, capacity_bytes=capacity,
        headroom_pct=(capacity - peak) / capacity * 100 if capacity and peak is not None else None,
        prediction_ratio=predicted / peak if predicted is not None and peak else None,
        busy=any(was_busy(a, cores) for a in attempts), unit=latest.unit,
        run_id=chosen.run_id, log=chosen.log, ds_config=chosen.ds_config,
        bubble=chosen.bubble, schedule_bubble=chosen.schedule_bubble,
        loss_last=chosen.loss_curve[-1] if ok and chosen.loss_curve else None,
        steps=len(chosen.loss_curve) if ok and chosen.loss_curve else None)


def summarize_points(records: list[SweepPointRecord], cores: int | None = None) -> list[PointRow]:
    """One row per point key, in the order the keys first appear in ``records``."""
    return [summarize_point(attempts, cores) for attempts in latest_attempts(records).values()]


def within_noise(faster: PointRow, other: PointRow, tie_pct: float) -> bool:
    """Equal: medians within ``tie_pct`` (the floor of run-to-run noise), or within the wider of the
    two spreads when the ranges of their repeats also overlap (a noisy point is not equal to a
    faster one just because it is noisy)."""
    diff = abs(faster.throughput_median - other.throughput_median) / faster.throughput_median * 100
    if diff <= tie_pct:
        return True
    overlap = other.throughput_max >= faster.throughput_min
    return overlap and diff <= max(faster.spread_pct, other.spread_pct)


def fits(row: PointRow, headroom_pct: float) -> bool:
    """Leaves at least ``headroom_pct`` of the capacity free; an unknown headroom counts as fitting."""
    return row.headroom_pct is None or row.headroom_pct >= headroom_pct


@dataclass(frozen=True)
class Ranking:
    rows: list[PointRow]  # ok rows by median throughput, fastest first; then the rest, input order
    recommended: PointRow | None
    equal: list[PointRow]  # ok rows that fit and are within noise of the recommended one
    baseline: PointRow | None
    why: str | None  # why nothing is recommended
    labels: dict[str, str]  # key -> "1", "=2" (tied), "-" (did not run ok)
    headroom_pct: float = 10.0
    tie_pct: float = 2.0

    def diff_pct(self, row: PointRow) -> float | None:
        base = self.baseline
        if base is None or not base.ran_ok or not row.ran_ok or not base.throughput_median:
            return None
        return (row.throughput_median - base.throughput_median) / base.throughput_median * 100

    def label(self, row: PointRow) -> str:
        return self.labels.get(row.key, "-")


def default_baseline(ok_rows: list[PointRow]) -> PointRow | None:
    """Plain data parallelism: the fastest ok point with ZeRO stage 0 and no offload."""
    plain = [r for r in ok_rows if r.point.stage == 0 and r.point.offload == "none"]
    return max(plain, key=lambda r: r.throughput_median, default=None)


def rank_labels(ok_rows: list[PointRow], tie_pct: float) -> dict[str, str]:
    """Competition ranks over rows fastest first; a contiguous run of rows within noise of its
    first row shares that row's rank, shown as ``=k``."""
    labels: dict[str, str] = {}
    i = 0
    while i < len(ok_rows):
        j = i + 1
        while j < len(ok_rows) and within_noise(ok_rows[i], ok_rows[j], tie_pct):
            j += 1
        for row in ok_rows[i:j]:
            labels[row.key] = f"={i + 1}" if j - i > 1 else f"{i + 1}"
        i = j
    return labels


def rank(rows: list[PointRow], *, baseline_key: str | None = None, headroom_pct: float = 10.0,
         tie_pct: float = 2.0) -> Ranking:
    ok_rows = sorted((r for r in rows if r.ran_ok), key=lambda r: -r.throughput_median)
    rest = [r for r in rows if not r.ran_ok]
    if baseline_key is None:
        baseline = default_baseline(ok_rows)
    else:
        baseline = next((r for r in rows if r.key == baseline_key), None)
        if baseline is None:
            raise ValueError(f"baseline {baseline_key!r} is not a point of this sweep; points: "
                             + ", ".join(r.key for r in rows))
    recommended = next((r for r in ok_rows if fits(r, headroom_pct)), None)
    equal = [r for r in ok_rows if recommended is not None and r is not recommended
             and fits(r, headroom_pct) and within_noise(recommended, r, tie_pct)]
    why = None if recommended else ("no point ran ok" if not ok_rows
                                    else f"no ok point leaves {headroom_pct:g}% headroom")
    return Ranking(ok_rows + rest, recommended, equal, baseline, why, rank_labels(ok_rows, tie_pct),
                   headroom_pct, tie_pct)


def format_throughput(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}" if value < 10 else f"{value:.1f}"


def _measured_text(row: PointRow) -> str:
    if row.repeats_ok < 2:
        return "1 run"
    return f"median of {row.repeats_ok}, CV {row.cv_pct:.1f}%"


def _memory_text(row: PointRow) -> str:
    if row.peak_mem_bytes is None:
        return ""
    text = f", peak {row.peak_mem_bytes / GIB:.1f} GiB"
    if row.capacity_bytes:
        text += f" of {row.capacity_bytes / GIB:.1f} GiB ({row.headroom_pct:.0f}% headroom)"
    return text


def recommendation_line(ranking: Ranking, unit: str) -> str:
    rec = ranking.recommended
    if rec is None:
        return f"recommended: none ({ranking.why})"
    line = (f"recommended: {rec.key}  {format_throughput(rec.throughput_median)} {unit} "
            f"({_measured_text(rec)}){_memory_text(rec)}")
    if ranking.equal:
        line += "; equal within noise: " + ", ".join(r.key for r in ranking.equal)
    return line
