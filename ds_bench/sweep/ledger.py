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

FINAL = ("ok", "oom", "skipped")


def load(path: str, sweep_id: str) -> dict[tuple[str, int], dict]:
    """The latest record of each (point key, repeat) of this sweep."""
    if not os.path.isfile(path):
        return {}
    latest = {}
    for r in results.read_records(path):
        if r.get("kind") == "sweep_point" and r.get("sweep") == sweep_id:
            latest[(r["key"], int(r.get("repeat", 0)))] = r
    return latest


def final(done: dict[tuple[str, int], dict], key: str, repeat: int) -> dict | None:
    r = done.get((key, repeat))
    return r if r is not None and r["status"] in FINAL else None


def point_record(*, sweep_id: str, spec, point, repeat: int, status: str, reason: str | None, world_size: int,
                 run: dict | None = None, predicted: int | None = None, capacity: int | None = None,
                 log: str | None = None, job=None, busy: dict | None = None) -> dict:
    metrics = (run or {}).get("metrics") or {}
    unit = "tokens/s" if "tokens_per_s" in metrics else f"{metrics.get('sample_unit') or 'samples'}/s"
    throughput = metrics.get("tokens_per_s", metrics.get("samples_per_s")) if status == "ok" else None
    return {
        "kind": "sweep_point", "sweep": sweep_id, "key": point.key, "point": point.to_dict(), "repeat": repeat,
        "status": status, "reason": reason, "workload": spec.workload, "size": (run or {}).get("size"),
        "world_size": world_size, "unit": unit, "throughput": throughput,
        "peak_mem_bytes": metrics.get("peak_mem_bytes") if status == "ok" else None,
        "baseline_mem_bytes": metrics.get("baseline_mem_bytes"),
        "predicted_mem_bytes": predicted, "capacity_bytes": capacity,
        "run_id": (run or {}).get("run_id"), "ds_config": (run or {}).get("ds_config"), "log": log,
        "params": (run or {}).get("params"), "largest_layer_params": (run or {}).get("largest_layer_params"),
        "wall_s": round(job.ended_at - job.started_at, 2) if job else 0.0,
        "launched_at": job.started_at if job else None, "ended_at": job.ended_at if job else None,
        "loop_started_at": (run or {}).get("loop_started_at"),
        "busy": busy, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
