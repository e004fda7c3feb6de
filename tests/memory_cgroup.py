"""A real memory cgroup with a limit, for tests that need the kernel's OOM killer (root; cgroup v1's memory
controller, else v2's): ``limited(bytes)`` creates it, ``move(pid)`` puts a process in it, and on the way out every
process left in it goes back to the root and the cgroup is removed.

    with limited(600 * 2**20) as cgroup:
        cgroup.move(pid)          # its allocations from now on count against the limit
        ...
        cgroup.oom_kills()        # the kernel's count of kills this limit caused
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "a memory cgroup needs root"
    if _v1_root().is_dir() or "memory" in _read(ROOT / "cgroup.controllers").split():
        return None
    return "no memory cgroup controller here (neither v1's /sys/fs/cgroup/memory nor v2's)"


@dataclass
class Cgroup:
    path: Path
    v1: bool

    def move(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.v1 else "memory.events"
        for line in _read(self.path / name).splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0


@contextlib.contextmanager
def limited(limit_bytes: int) -> Iterator[Cgroup]:
    v1 = _v1_root().is_dir()
    parent = _v1_root() if v1 else ROOT
    if not v1 and "memory" not in _read(ROOT / "cgroup.subtree_control").split():
        (ROOT / "cgroup.subtree_control").write_text("+memory\n")
    path = parent / f"dsb_oom_{os.getpid()}"
    path.mkdir()
    cgroup = Cgroup(path, v1)
    try:
        (path / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(f"{limit_bytes}\n")
        swap = path / ("memory.memsw.limit_in_bytes" if v1 else "memory.swap.max")  # no way out through swap
        if swap.exists():
            swap.write_text(f"{limit_bytes if v1 else 0}\n")
        yield cgroup
    finally:
        for pid in _read(path / "cgroup.procs").split():
            with contextlib.suppress(OSError):
                (parent / "cgroup.procs").write_text(f"{pid}\n")
        deadline = time.monotonic() + 10
        while True:
            try:
                path.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def _v1_root() -> Path:
    return ROOT / "memory"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
