"""The sweep's results file: one ``sweep_point`` record per attempt, and the sweep's only state.

A re-run of the same sweep (same ``sweep`` id: ``SweepSpec.sweep_id``) reads it back and keeps every
attempt that ended ``ok``, ``oom`` or ``skipped`` (final: re-running them would measure the same
thing or fail the same way); ``timeout`` and ``crashed`` attempts run again, and the later record
supersedes the earlier one. Records are appended whole (``results.append_record``), so an
interrupted sweep leaves only finished points behind.
"""

from __future__ import annotations

import os
import time

from ds_bench.record import store as results
from ds_bench.record.schema import Busy, RunRecord, SweepPointRecord

FINAL = ("ok", "oom", "skipped")


def load(path: str, sweep_id: str) -> dict[tuple[str, int], SweepPointRecord]:
    """The latest record of each (point key, repeat) of this sweep."""
    if not os.path.isfile(path):
        return {}
    latest = {}
    for r in results.read_records(path, SweepPointRecord):
        if r.sweep == sweep_id:
            latest[(r.key, r.repeat)] = r
    return latest


def final(done: dict[tuple[str, int], SweepPointRecord], key: str, repeat: int) -> SweepPointRecord | None:
    r = done.get((key, repeat))
    return r if r is not None and r.status in FINAL else None


def point_record(*, sweep_id: str, spec, point, repeat: int, status: str, reason: str | None, world_size: int,
                 run: RunRecord | None = None, predicted: int | None = None, capacity: int | None = None,
                 log: str | None = None, job=None, busy: dict | None = None) -> SweepPointRecord:
    """The record of one attempt; ``run``: the point's run record (ok if one is), None when it wrote none."""
    m = run.metrics if run is not None else None
    unit = "tokens/s" if m and m.tokens_per_s is not None else f"{(m and m.sample_unit) or 'samples'}/s"
    throughput = (m.tokens_per_s if m.tokens_per_s is not None else m.samples_per_s) if m and status == "ok" else None
    return SweepPointRecord(
        kind="sweep_point", sweep=sweep_id, key=point.key, point=point.to_dict(), repeat=repeat,
        status=status, reason=reason, workload=spec.workload, size=run and run.size,
        world_size=world_size, unit=unit, throughput=throughput,
        peak_mem_bytes=m.peak_mem_bytes if m and status == "ok" else None,
        baseline_mem_bytes=m and m.baseline_mem_bytes,
        predicted_mem_bytes=predicted, capacity_bytes=capacity,
        run_id=run and run.run_id, ds_config=run and run.ds_config, log=log,
        params=run and run.params, largest_layer_params=run and run.largest_layer_params,
        wall_s=round(job.ended_at - job.started_at, 2) if job else 0.0,
        launched_at=job.started_at if job else None, ended_at=job.ended_at if job else None,
        loop_started_at=run and run.loop_started_at,
        busy=Busy(**busy) if busy is not None else None, time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        bubble=measured_bubble(run) if status == "ok" else None,
        schedule_bubble=run and run.schedule_bubble,
    )


def measured_bubble(run: RunRecord | None) -> float | None:
    """A pipeline run's idle share of its devices' time: the mean of its stages' measured bubbles
    (each stage's median over measured steps); None without a pipeline or without every stage's timers."""
    stages = (run and run.pipeline_layout) or []
    bubbles = [s.bubble for s in stages]
    if not bubbles or any(b is None for b in bubbles):
        return None
    return sum(bubbles) / len(bubbles)
