"""The sweep's record of one attempt of one point (``kind: sweep_point``), from what the attempt's run
recorded; the sweep's results file of them is its state (``ds_bench.jobs.ledger``)."""

from __future__ import annotations

import time

from ds_bench.jobs import point_time
from ds_bench.jobs.slurm_batch import slurm_block
from ds_bench.record.schema import Busy, PointTime, RunRecord, SweepPointRecord


def point_record(*, sweep_id: str, spec, point, repeat: int, status: str, reason: str | None, world_size: int,
                 run: RunRecord | None = None, predicted: int | None = None, capacity: int | None = None,
                 log: str | None = None, job=None, busy: dict | None = None, slurm=None) -> SweepPointRecord:
    """The record of one attempt; ``run``: the point's run record (ok if one is), None when it wrote none;
    ``slurm``: the attempt's ``SlurmEnd`` under ``--executor slurm``."""
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
        loop_started_at=run and run.loop_started_at, time_split=_time_split(run, job) if status == "ok" else None,
        busy=Busy(**busy) if busy is not None else None, **slurm_block(slurm), time=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        bubble=measured_bubble(run) if status == "ok" else None,
        schedule_bubble=run and run.setting("schedule_bubble"),
        versions=run.versions if run is not None and run.versions else None,
        loss_curve=m.loss_curve if m and status == "ok" else None,
        grad_norm_curve=m.grad_norm_curve if m and status == "ok" else None,
    )


def _time_split(run: RunRecord | None, job) -> PointTime | None:
    fields = point_time.split(run, job.started_at, job.ended_at) if job else None
    return PointTime(**{k: None if v is None else round(v, 3) for k, v in fields.items()}) if fields else None


def measured_bubble(run: RunRecord | None) -> float | None:
    """A pipeline run's idle share of its devices' time: the mean of its stages' measured bubbles
    (each stage's median over measured steps); None without a pipeline or without every stage's timers."""
    stages = (run and run.pipeline_layout) or []
    bubbles = [s.bubble for s in stages]
    if not bubbles or any(b is None for b in bubbles):
        return None
    return sum(bubbles) / len(bubbles)
