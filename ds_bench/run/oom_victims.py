"""Ranks the kernel's OOM killer ended, found by a surviving peer on their host (``victims``), and the ``failed``
record each gets from it (``victim_record``): the killed rank got SIGKILL and wrote nothing, and its launcher then
stopped the others with SIGTERM, so without this the run's only records said ``terminated``.

A peer on this host that is gone without a record of its own counts as OOM-killed when the kernel's log names its pid in a ``Killed process``
line logged since the run joined, or, where that log cannot be read (it is root's) or its pids are not ours (a
container's pid namespace), when this cgroup's OOM-kill count (else the host's) rose by at least as many as are
gone (``machine.oom_kills``). The lowest rank on the host that is not a victim writes the victims' records.
"""

from __future__ import annotations

import socket

from ds_bench.errors import UserError
from ds_bench.machine import oom_kills
from ds_bench.record import store as results
from ds_bench.record.schema import Failure, OomKill, RunRecord
from ds_bench.run.state import Started

GiB = 2**30


def victims(run: Started, troubled: dict[int, str]) -> dict[int, OomKill]:
    """The ranks among ``troubled``'s ``gone`` ones (peers on this host that did not record their own end) the OOM
    killer ended, with the evidence: the kernel log's kill of that pid since the run joined, where the log is
    readable and its pids are ours; else the cgroup's (or the host's) count, risen by at least as many as are
    gone."""
    gone = [p for p in run.peers if troubled.get(p["rank"]) == "gone"]
    if not gone or run.oom_counts is None:
        return {}
    recorded = _ranks_recorded(run)  # read only now: most failures have no peer gone on this host
    gone = [p for p in gone if p["rank"] not in recorded]
    if not gone:
        return {}
    now = oom_kills.read_counts()
    kernel_rise, cgroup_rise = now.rise_since(run.oom_counts)
    log = oom_kills.read_kernel_log() if oom_kills.logged_pids_are_ours() else None
    if log is not None:
        logged = oom_kills.kernel_kills(log, since_us=run.oom_counts.at_us)
        found = {p["rank"]: (p, logged[p["pid"]]) for p in gone if p["pid"] in logged}
    else:
        rise = now.kills_since(run.oom_counts)
        found = {p["rank"]: (p, None) for p in gone} if rise and rise >= len(gone) else {}
    out = {}
    for rank, (peer, kill) in found.items():
        by_cgroup = (kill.constraint == "CONSTRAINT_MEMCG") if kill and kill.constraint else bool(cgroup_rise)
        out[rank] = OomKill(
            pid=peer["pid"], rss_bytes=kill.rss_bytes if kill else None,
            cause="cgroup limit" if by_cgroup else "machine memory" if kill else None,
            evidence="kernel log" if kill else "oom_kill counters", kernel_oom_kills=kernel_rise,
            cgroup_oom_kills=cgroup_rise, cgroup=now.cgroup_path, reported_by=run.state.rank)
    return out


def _ranks_recorded(run: Started) -> set[int]:
    """Ranks with a record of this run in its results file already (a peer that recorded its own end, or a victim
    another survivor recorded)."""
    try:
        records = results.read_records(run.cfg.results, RunRecord, missing_ok=True)
    except (OSError, UserError):  # a results file this rank cannot read: judge by /proc alone
        return set()
    return {r.failure.rank for r in records if r.run_id == run.run_id and r.failure is not None}


def reports_them(run: Started, killed: dict[int, OomKill]) -> bool:
    """Whether this rank writes the victims' records: the lowest rank on this host that is not one of them, as
    every survivor there works it out alike (``victim_record`` is then skipped for a rank already recorded)."""
    host = socket.gethostname()
    others = [p["rank"] for p in run.peers if p["host"] == host and p["rank"] not in killed]
    return run.state.rank == min(others, default=run.state.rank)


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
