"""The kernel's OOM kills on this host: its counters, and its log's account of each kill.

A rank the OOM killer ends gets SIGKILL and writes nothing; what it leaves is here, for its surviving peers to
record (``ds_bench.run.run_record``):
- ``/proc/vmstat``'s ``oom_kill``: every OOM kill on the host since boot (Linux >= 4.13, world-readable);
- the memory cgroup's own count (cgroup v2 ``memory.events``, v1 ``memory.oom_control``: ``oom_kill N``), which
  counts the kills a cgroup's limit caused (a Slurm job's, a container's);
- the kernel log (``/dev/kmsg``, readable by root or where ``kernel.dmesg_restrict`` is 0): one line per kill
  naming the process and its resident memory at the kill, e.g. ``Memory cgroup out of memory: Killed process 29945
  (python3) total-vm:221460kB, anon-rss:204160kB, file-rss:6624kB, shmem-rss:0kB``, after an ``oom-kill:`` line
  whose ``constraint=CONSTRAINT_MEMCG`` says a cgroup's limit caused it (``CONSTRAINT_NONE``: the whole machine).
The parsers are pure; the readers return None for what cannot be read.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

_COUNT = re.compile(r"^oom_kill (\d+)$", re.MULTILINE)
_KMSG_TIME = re.compile(r"^\d+,\d+,(\d+),[^;]*;")
"""A /dev/kmsg record's prefix: priority, sequence, microseconds since boot (CLOCK_MONOTONIC's), flags."""
_KILLED = re.compile(r"Killed process (\d+) \(.*?\) total-vm:\d+kB, anon-rss:(\d+)kB, file-rss:(\d+)kB, "
                     r"shmem-rss:(\d+)kB")
_CONSTRAINT = re.compile(r"oom-kill:constraint=(\w+),.*?,pid=(\d+),")
KMSG_RECORDS = 100_000
"""At most this many kernel log records are read (the ring buffer holds far fewer)."""


@dataclass(frozen=True)
class OomCounts:
    """The host's and this process's cgroup's OOM kills so far (None: not readable here)."""

    kernel: int | None
    cgroup: int | None
    cgroup_path: str | None = None
    at_us: float | None = None
    """When they were read: CLOCK_MONOTONIC in microseconds, the clock of the kernel log's records."""

    def kills_since(self, before: OomCounts) -> int | None:
        """The kills since ``before`` that count for this process: its cgroup's where readable (a Slurm job's, a
        container's: its own), else the host's; None where neither is."""
        kernel, cgroup = self.rise_since(before)
        return cgroup if cgroup is not None else kernel

    def rise_since(self, before: OomCounts) -> tuple[int | None, int | None]:
        """(kernel, cgroup) kills since ``before``; None where either reading is missing."""
        def rise(now, then):
            return None if now is None or then is None else now - then

        return rise(self.kernel, before.kernel), rise(self.cgroup, before.cgroup)


@dataclass(frozen=True)
class KernelKill:
    """One kill as the kernel logged it."""

    pid: int
    rss_bytes: int
    """Anonymous + file + shared resident memory of the process at the kill."""
    constraint: str | None
    """``CONSTRAINT_MEMCG`` (a cgroup's limit), ``CONSTRAINT_NONE`` (the machine's memory), None: not logged."""
    at_us: int | None = None
    """When the kernel logged it (microseconds since boot); None: a log line without its /dev/kmsg prefix."""


def oom_kill_count(text: str) -> int | None:
    """The ``oom_kill N`` line of /proc/vmstat, memory.events or memory.oom_control (pure)."""
    match = _COUNT.search(text)
    return int(match.group(1)) if match else None


def cgroup_counter_file(proc_cgroup: str, root: str = "/sys/fs/cgroup") -> str | None:
    """The file that counts this process's cgroup's OOM kills, from /proc/self/cgroup's lines (pure): the v1 memory
    controller's ``memory.oom_control`` where there is one, else the v2 (unified) cgroup's ``memory.events``."""
    unified = None
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return os.path.join(root, "memory", path.lstrip("/"), "memory.oom_control")
        if controllers == "":
            unified = path
    if unified is None:
        return None
    base = os.path.join(root, "unified") if os.path.isdir(os.path.join(root, "unified")) else root
    return os.path.join(base, unified.lstrip("/"), "memory.events")


def kernel_kills(log: str, since_us: float | None = None) -> dict[int, KernelKill]:
    """pid -> its kill, from kernel log text (pure); with ``since_us``, only kills logged from then on (a pid the
    kernel reused since an older kill is not that process)."""
    constraints = {int(pid): constraint for constraint, pid in _CONSTRAINT.findall(log)}
    out = {}
    for line in log.splitlines():
        killed = _KILLED.search(line)
        if not killed:
            continue
        stamp = _KMSG_TIME.match(line)
        at_us = int(stamp.group(1)) if stamp else None
        if since_us is not None and at_us is not None and at_us < since_us:
            continue
        pid, anon, file, shmem = map(int, killed.groups())
        out[pid] = KernelKill(pid, (anon + file + shmem) * 1024, constraints.get(pid), at_us)
    return out


def pids_are_the_kernels(status: str) -> bool:
    """Whether this process's pids are the ones the kernel logs: /proc/self/status's ``NSpid`` has one entry in
    the initial pid namespace, one per namespace in a container (pure)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) == 2
    return True  # kernels before 4.1 have no NSpid: no namespaces to tell apart


def read_counts() -> OomCounts:
    kernel = _read(lambda: oom_kill_count(_text("/proc/vmstat")))
    path = _read(lambda: cgroup_counter_file(_text("/proc/self/cgroup")))
    cgroup = _read(lambda: oom_kill_count(_text(path))) if path else None
    return OomCounts(kernel, cgroup, path if cgroup is not None else None, time.monotonic() * 1e6)


def logged_pids_are_ours() -> bool:
    return bool(_read(lambda: pids_are_the_kernels(_text("/proc/self/status"))))


def read_kernel_log(limit: int = KMSG_RECORDS) -> str | None:
    """The kernel log's records still in its ring buffer (``/dev/kmsg``, without blocking), None if not readable."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    records = []
    try:
        for _ in range(limit):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:  # the end of the buffer
                break
            except BrokenPipeError:  # a record overwritten while reading: go on with the next
                continue
            if not record:  # a /dev/kmsg that is /dev/null (some containers)
                break
            records.append(record.decode(errors="replace"))
    except OSError:
        return None
    finally:
        os.close(fd)
    return "".join(records)


def _text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _read(read):
    try:
        return read()
    except (OSError, ValueError):
        return None
