"""Where a study job's wall time goes, launch to exit (pure): the launcher's start, the run's start-up phases
(``ds_bench.run.startup``), the warm-up, the measured window and the exit, so a user sees what a sweep point costs
beside what it measures.

Clocks: the job's launch and end are the study's (``spawn.JobEnd``), the phases in between rank 0's; on one node
they are one clock, across hosts (Slurm) the launcher and exit shares absorb any skew between them.
"""

from __future__ import annotations

from ds_bench.record.run_schema import RunRecord

PHASES = ("launcher", "imports", "prepare", "ops", "process_group", "libraries", "build", "warmup", "measured", "exit")
"""The split's phases in the order a job goes through them (``PointTime``'s fields, less ``_s``)."""


def split(run: RunRecord | None, launched_at: float | None, ended_at: float | None) -> dict | None:
    """``PointTime``'s fields for a job launched and ended at these Unix times whose run recorded ``run``; None
    when the run left no start-up marks (it failed before its window, or a record of an older version)."""
    s = run and run.startup
    m = run and run.metrics
    if s is None or m is None or None in (s.process_started_at, s.total_s, m.window_wall_s, launched_at, ended_at):
        return None
    window_closed_at = s.process_started_at + s.total_s + m.window_wall_s
    build = [s.model_build_s, s.engine_s, s.data_s, s.other_s]
    return {"launcher_s": s.process_started_at - launched_at, "imports_s": s.imports_s, "prepare_s": s.prepare_s,
            "ops_s": s.ops_s, "process_group_s": s.process_group_s, "libraries_s": s.libraries_s,
            "build_s": sum(v for v in build if v is not None), "warmup_s": (s.warmup_s or 0.0) + (s.compile_s or 0.0),
            "measured_s": m.window_wall_s, "exit_s": ended_at - window_closed_at, "wall_s": ended_at - launched_at}
