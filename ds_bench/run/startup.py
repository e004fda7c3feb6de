"""Where a run's time goes before its first measured step (rank 0's own clock).

``begin`` is called as ``run`` starts; the phases after it are filled in as the run reaches them
(``prepare_s`` by ``run.main``, ``ops_s`` and ``process_group_s`` by ``cluster.join``, ``data_s`` and
``window_open_at`` by ``run.training``); ``breakdown`` turns them into the record's ``startup`` block:

  imports_s        process start (the kernel's, ``psutil``) -> ``ds-bench run`` entered: interpreter,
                   torch and ds_bench imports, argument parsing
  prepare_s        input checks, DeepSpeed config resolution, data read and tokenized (before joining)
  ops_s            DeepSpeed JIT op loads (a build, the first time in an environment)
  process_group_s  rendezvous and process-group init
  libraries_s      the libraries every run imports anyway, loaded before the memory baseline
                   (``run.training.PRELOADED``: torch._dynamo, DeepSpeed's optimizers; the workload's)
  model_build_s    the workload's model (``build.model_s``; ZeRO-3: partitioned)
  engine_s         ``deepspeed.initialize`` or the DDP/FSDP wrap (``build.engine_s``)
  data_s           the first batch (files read, tokenized, cached)
  compile_s        ``--compile``: dynamo's compile time inside the warm-up steps (``measure.compile_stats``)
  warmup_s         the warm-up steps, until the measured window opens, less compile_s
  other_s          total_s less the phases: what lies between them (DeepSpeed's own imports after the
                   join, the run id and peers exchanged, the memory baseline read)
  total_s          process start -> the window opens (what a sweep point costs before it measures)
"""

from __future__ import annotations

import os
import time

import psutil


def begin() -> dict:
    """The marks of a starting run: when its process started and when ``run`` was entered (Unix s)."""
    return {"process_started_at": process_start(), "entered_at": time.time()}


def process_start(stat_path: str = "/proc/self/stat") -> float:
    """Unix time (s) this process started, to the kernel's tick (10 ms): its start in ticks since boot
    (``/proc/self/stat`` field 22) against ``CLOCK_BOOTTIME`` now. psutil's ``create_time`` adds those ticks to
    ``/proc/stat``'s ``btime``, whole seconds, so it reads up to 1 s early (a launcher's share low, the imports'
    high). Elsewhere (no /proc): psutil's."""
    try:
        with open(stat_path, encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started_ticks = int(fields[19])  # field 22 of the whole line; fields[0] is field 3 (state)
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_start
    except (OSError, ValueError, IndexError, AttributeError):
        return psutil.Process().create_time()


def breakdown(marks: dict, build: dict | None, loop_started_at: float) -> dict:
    """The record's ``startup`` (seconds; None where a mark is missing, e.g. a pipeline's build)."""
    started, opened = marks.get("process_started_at"), marks.get("window_open_at")
    build = build or {}
    out = {"process_started_at": started, "imports_s": marks["entered_at"] - started if started else None,
            "prepare_s": marks.get("prepare_s"), "ops_s": marks.get("ops_s"),
            "process_group_s": marks.get("process_group_s"), "libraries_s": marks.get("libraries_s"),
            "model_build_s": build.get("model_s"), "engine_s": build.get("engine_s"), "data_s": marks.get("data_s"),
            "compile_s": marks.get("compile_s"),
            "warmup_s": opened - loop_started_at - (marks.get("compile_s") or 0.0) if opened else None,
            "total_s": opened - started if opened and started else None}
    if out["total_s"] is not None:
        out["other_s"] = out["total_s"] - sum(v for k, v in out.items()
                                              if k.endswith("_s") and k != "total_s" and v is not None)
    return out
