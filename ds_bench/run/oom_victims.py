"""Ranks the kernel's OOM killer ended, found by a surviving peer on their host (``victims``), and the ``failed``
record each gets from it (``victim_record``): the killed rank got SIGKILL and wrote nothing, and its launcher then
stopped the others with SIGTERM, so without this the run's only records said ``terminated``.

A peer on this host that is gone counts as OOM-killed when the kernel's log names its pid in a ``Killed process``
line, or else when the host's or this cgroup's OOM-kill count rose during the run (``machine.oom_kills``; a
container's pids differ from the kernel's, and the log is root's). The lowest-ranked survivor on the host writes
the victims' records, once.
"""

from __future__ import annotations

import socket

from ds_bench.machine import oom_kills
from ds_bench.record.schema import Failure, OomKill, RunRecord
from ds_bench.run.state import Started

GiB = 2**30


def victims(run: Started, troubled: dict[int, str]) -> dict[int, OomKill]:
    """The ranks among ``troubled``'s ``gone`` ones (peers on this host) the OOM killer ended, with the evidence."""
    gone = [p for p in run.peers if troubled.get(p["rank"]) == "gone"]
    if not gone or run.oom_counts is None:
        return {}
    now = oom_kills.read_counts()
    kernel_rise, cgroup_rise = now.rise_since(run.oom_counts)
    log = oom_kills.read_kernel_log()
    logged = oom_kills.kernel_kills(log) if log else {}
    out = {}
    for peer in gone:
        kill = logged.get(peer["pid"])
        if kill is None and not (kernel_rise or cgroup_rise):
            continue
        by_cgroup = (kill.constraint == "CONSTRAINT_MEMCG") if kill and kill.constraint else bool(cgroup_rise)
        out[peer["rank"]] = OomKill(
            pid=peer["pid"], rss_bytes=kill.rss_bytes if kill else None,
            cause="cgroup limit" if by_cgroup else "machine memory" if kill else None,
            evidence="kernel log" if kill else "oom_kill counters", kernel_oom_kills=kernel_rise,
            cgroup_oom_kills=cgroup_rise, cgroup=now.cgroup_path, reported_by=run.state.rank)
    return out


def reports_them(run: Started, troubled: dict[int, str]) -> bool:
    """Whether this rank writes the victims' records: the lowest rank on this host still running."""
    host = socket.gethostname()
    alive = [p["rank"] for p in run.peers if p["host"] == host and p["rank"] not in troubled]
    return run.state.rank == min(alive, default=run.state.rank)


def describe(rank: int, kill: OomKill, steps_done: int, steps: int) -> str:
    """The victim's one line (pure)."""
    where = {"cgroup limit": " (its cgroup's memory limit)", "machine memory": " (the machine's memory)"}.get(
        kill.cause or "", "")
    rss = f", {kill.rss_bytes / GiB:.2f} GiB resident at the kill" if kill.rss_bytes is not None else ""
    counts = [f"{name} +{n}" for name, n in (("kernel oom_kill", kill.kernel_oom_kills),
                                             ("cgroup oom_kill", kill.cgroup_oom_kills)) if n]
    evidence = f"; {kill.evidence}" + (f": {', '.join(counts)}" if counts else "")
    return (f"rank {rank}: killed by the kernel's OOM killer{where} with SIGKILL near step {steps_done} of {steps}"
            f"{rss}{evidence} (recorded by rank {kill.reported_by})")


def victim_record(run: Started, rank: int, kill: OomKill, record_of) -> RunRecord:
    """The victim's ``failed`` record, ``kind: oom``; ``record_of``: ``run_record.run_record``."""
    peer = next(p for p in run.peers if p["rank"] == rank)
    steps_done = run.times.steps_done
    failure = Failure(kind="oom", steps_done=steps_done, rank=rank, host=peer["host"], signal=kill.signal,
                      oom_kill=kill)
    return record_of(run, "failed", error=describe(rank, kill, steps_done, run.cfg.steps), failure=failure)
