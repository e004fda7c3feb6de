"""Pure reductions from per-rank measurements to the run's metrics.

Definitions (all over measured steps only, warm-up excluded):
- step time of step i = max over ranks (the straggler sets the pace of synchronous training);
- ``step_ms_median`` / ``step_ms_p90``: median and 90th percentile (linear interpolation) of those;
- ``samples_per_s`` = train_batch_size x measured steps / sum of step times (global);
  ``samples_per_s_per_device`` = that / world size;
- ``peak_mem_bytes``: max over ranks of each rank's peak (GPU: max allocated; CPU: peak RSS),
  ``peak_mem_bytes_mean`` the mean over ranks; ``baseline_mem_bytes``: max over ranks of what a
  rank held before the model was built (the part of the peak no configuration changes);
- the loss of a step is the mean over ranks (equal micro-batches, so the global-batch mean);
- ``compute_ms_per_rank``: each rank's own median over steps of its compute time (forward +
  autograd backward, ``ds_bench.measure.loop``), indexed by rank, with ``host_per_rank`` beside it:
  not reduced over ranks, since telling the ranks apart is the point (``ds_bench.measure.slow_ranks``);
- ``window_wall_s``: wall time of the measured window, opening barrier to closing barrier (max over
  ranks), the outside clock the step times must agree with (``outside_clock``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class RankReport:
    rank: int
    host: str
    step_s: list[float]
    phase_s: dict[str, list[float]]
    losses: list[float]
    grad_norms: list[float | None] = field(default_factory=list)
    """Per step (warm-up included): the global gradient norm the engine computed, None where it computed none."""
    peak_mem: dict[str, int] = field(default_factory=dict)
    """``rss`` on CPU; ``allocated`` and ``reserved`` on GPU."""
    compute_s: list[float] = field(default_factory=list)
    """Forward + autograd backward per measured step (``ds_bench.measure.loop``)."""
    window_s: float = 0.0
    """Wall time of the measured window on this rank, barrier to barrier (``ds_bench.measure.loop``)."""
    pipeline_stage: int | None = None
    """Pipeline runs: this rank's stage."""
    stage_s: dict[str, list[float]] = field(default_factory=dict)
    """Pipeline runs: each instruction timer's seconds per measured step (``ds_bench.measure.stage_timers``);
    tensor- and sequence-parallel runs: AutoTP's all-reduce or Ulysses' all-to-all seconds and count
    (``ds_bench.measure.layout_comm``)."""
    compiled: dict | None = None
    """``--compile``: this rank's counts (``ds_bench.measure.compile_stats.summarize``)."""


def straggler_steps(reports: list[RankReport]) -> np.ndarray:
    return np.max(np.array([r.step_s for r in reports], dtype=float), axis=0)


def summarize(reports: list[RankReport], train_batch_size: int) -> dict:
    steps = straggler_steps(reports)
    world = len(reports)
    window = float(steps.sum())
    losses = np.mean(np.array([r.losses for r in reports], dtype=float), axis=0)
    peak_key = "allocated" if "allocated" in reports[0].peak_mem else "rss"
    peaks = np.array([r.peak_mem.get(peak_key, 0) for r in reports], dtype=float)
    metrics = {
        "steps_measured": int(steps.size),
        "samples_per_s": train_batch_size * steps.size / window,
        "samples_per_s_per_device": train_batch_size * steps.size / window / world,
        "step_ms_median": float(np.median(steps)) * 1e3,
        "step_ms_p90": float(np.percentile(steps, 90)) * 1e3,
        "step_ms_mean": float(steps.mean()) * 1e3,
        "step_ms_min": float(steps.min()) * 1e3,
        "step_ms_max": float(steps.max()) * 1e3,
        "breakdown_ms_median": phase_medians(reports),
        "peak_mem_bytes": int(peaks.max()),
        "peak_mem_bytes_mean": int(peaks.mean()),
        "peak_mem_kind": peak_key,
        "baseline_mem_bytes": int(max(r.peak_mem.get("baseline", 0) for r in reports)),
        "loss_first": float(losses[0]),
        "loss_last": float(losses[-1]),
        "loss_curve": [round(float(x), 6) for x in losses],
        "grad_norm_curve": grad_norm_curve(reports),
    }
    metrics.update(per_rank_compute(reports))
    metrics.update(outside_clock(window, reports))
    if peak_key == "allocated":
        metrics["peak_mem_reserved_bytes"] = int(max(r.peak_mem.get("reserved", 0) for r in reports))
    return metrics


def grad_norm_curve(reports: list[RankReport]) -> list[float | None] | None:
    """The global gradient norm of every step, rank 0's (the norm is global: every rank computes the same one),
    rounded to 6 significant digits; None when the engine computed none at any step."""
    norms = reports[0].grad_norms
    if not norms or all(g is None for g in norms):
        return None
    return [None if g is None else float(f"{g:.6g}") for g in norms]


def outside_clock(steps_sum_s: float, reports: list[RankReport]) -> dict:
    """Step times against the outside clock, the window's wall time barrier to barrier.

    ``rank_steps_vs_wall_pct``: each rank's own sum of step times against its own window, the rank
    furthest off (negative: time in the window outside any step, the loop's own bookkeeping); this
    checks the harness's clock. ``steps_vs_wall_pct``: the sum of straggler step times (what
    ``samples_per_s`` divides by) against the longest rank's window; it can exceed it slightly, as
    the slowest rank of one step need not be the slowest of the next."""
    if not all(r.window_s > 0 for r in reports):
        return {}
    wall = max(r.window_s for r in reports)
    per_rank = [(sum(r.step_s) / r.window_s - 1) * 100 for r in reports]
    return {"window_wall_s": wall, "steps_sum_s": steps_sum_s, "steps_vs_wall_pct": (steps_sum_s / wall - 1) * 100,
            "rank_steps_vs_wall_pct": max(per_rank, key=abs)}


def phase_medians(reports: list[RankReport]) -> dict[str, float]:
    """Median over steps of each phase's straggler time, in ms."""
    out = {}
    for name in reports[0].phase_s:
        per_step = np.max(np.array([r.phase_s[name] for r in reports], dtype=float), axis=0)
        out[name] = float(np.median(per_step)) * 1e3
    return out


def per_rank_compute(reports: list[RankReport]) -> dict:
    """``compute_ms_per_rank`` and ``host_per_rank``, in rank order; nothing without compute times."""
    if not all(r.compute_s for r in reports):
        return {}
    ordered = sorted(reports, key=lambda r: r.rank)
    return {"compute_ms_per_rank": [float(np.median(r.compute_s)) * 1e3 for r in ordered],
            "host_per_rank": [r.host for r in ordered]}
