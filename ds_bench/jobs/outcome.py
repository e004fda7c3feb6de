"""What became of a launched point, and whether the machine was busy while it ran.

``classify`` reads the point's own run records (``status``, ``failure.kind``, which the run sets from
the exception type: ``ds_bench.machine.memory.is_out_of_memory``) and the launcher's exit status, never
free text:
- ``timeout``: the sweep stopped it at ``--timeout`` (whatever the ranks recorded on the way out);
- ``ok``: a record with status ok and exit status 0;
- ``oom``: any rank recorded ``failure.kind == "oom"`` (the rank that ran out; its peers then fail
  on the lost connection, which is not the cause);
- ``oom`` too: no record at all while the host's OOM-kill count rose (a lone rank the OOM killer ended: no
  survivor wrote its record, ``ds_bench.run.oom_victims``);
- ``crashed``: anything else: a non-zero exit, a signal, or no record at all.

``Busy`` measures other work on the machine during a point: the 1-minute load average before and
after, and ``other_cores`` = (CPU time the whole machine was busy − CPU time of the point's own
processes) / wall time, from /proc/stat (psutil) and ``RUSAGE_CHILDREN`` (the point's processes,
all waited for by the time it is read). On GPU nodes, the compute processes nvidia-smi lists that
are not the point's own.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

import psutil

from ds_bench.record.schema import Busy, RunRecord, ScalingRow, SweepPointRecord


def classify(records: list[RunRecord], exit_code: int | None, timed_out: bool, timeout_s: float,
             oom_kills: int = 0) -> tuple[str, str | None]:
    """(status, reason) of one attempt (pure). ``oom_kills``: how much the host's OOM-kill count rose while it ran
    (``machine.oom_kills``; the cgroup's count where readable, the host's else): a job that failed with no record
    then lost its rank to the OOM killer."""
    if timed_out:
        return "timeout", f"no result within {timeout_s:g} s (--timeout); the point was stopped"
    failed = [r for r in records if r.status == "failed"]
    oom = [r for r in failed if r.failure is not None and r.failure.kind == "oom"]
    if oom:
        return "oom", oom[0].error
    if exit_code == 0 and any(r.status == "ok" for r in records):
        return "ok", None
    if failed:
        own = [r for r in failed if r.failure is None or not r.failure.peers] or failed
        return "crashed", own[0].error
    if oom_kills > 0:
        return "oom", (f"{describe_exit(exit_code)} with no record; the kernel's OOM killer ended {oom_kills} "
                       "process(es) of this study's cgroup (else this host) meanwhile")
    return "crashed", f"{describe_exit(exit_code)} with no record"


def describe_exit(code: int | None) -> str:
    if code is None:
        return "no exit status"
    if code < 0:
        return f"killed by {_signal_name(-code)}"
    if code > 128 and _signal_name(code - 128):
        return f"exit code {code} ({_signal_name(code - 128)})"
    return f"exit code {code}"


def _signal_name(num: int) -> str | None:
    try:
        return signal.Signals(num).name
    except ValueError:
        return None


@dataclass
class BusyProbe:
    load_before: float
    busy_before: float
    children_before: float
    start: float

    @classmethod
    def start_now(cls) -> BusyProbe:
        return cls(os.getloadavg()[0], _machine_busy_s(), _children_cpu_s(), time.monotonic())

    def finish(self) -> dict:
        wall = max(time.monotonic() - self.start, 1e-9)
        other = ((_machine_busy_s() - self.busy_before) - (_children_cpu_s() - self.children_before)) / wall
        return {"load_before": round(self.load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                "other_cores": round(max(other, 0.0), 2), "cores": os.cpu_count(), "gpu_others": gpu_others()}


def _machine_busy_s() -> float:
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


def _children_cpu_s() -> float:
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def gpu_others(own_pids: set[int] | None = None) -> list[dict]:
    """Compute processes on the GPUs that are not ours (nvidia-smi; [] where there is none)."""
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    apps = []
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0].isdigit() and int(parts[0]) not in (own_pids or set()):
            apps.append({"pid": int(parts[0]), "used_mib": float(parts[1]) if parts[1].replace(".", "").isdigit() else None})
    return apps


BUSY_OTHER_CORES = 0.5
"""Other processes using half a core or more during a point make its timing suspect."""


def was_busy(record: SweepPointRecord | ScalingRow, cores: int | None = None) -> bool:
    """Whether the machine was shared while this attempt (a sweep point's record, a scaling row) ran:
    other processes used half a core or more, other processes held the GPU, or, for a record without
    ``other_cores``, the load average before it started was already at least ``cores`` (not judged when
    ``cores`` is None). The load average is not judged beside ``other_cores``: it counts the study's own previous
    job (a 1-minute average: after ~10 s jobs on 2 busy cores it stays at ~2, and ``make bench`` called 10 of its 15
    points busy while other processes used 0-0.01 cores)."""
    busy = record.busy or Busy()
    if (busy.other_cores or 0.0) >= BUSY_OTHER_CORES or busy.gpu_others:
        return True
    return busy.other_cores is None and cores is not None and (busy.load_before or 0.0) >= cores
