"""DeepSpeed's shared-memory all-reduce buffers in ``/dev/shm``: release ours, find leftovers.

On CPU ranks that share one machine, DeepSpeed's ``deepspeed_shm_comm`` op creates one buffer per
rank, ``deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>`` (66 MiB each with
deepspeed 0.19.8), maps every rank's buffer, and never unlinks them (``shared_close`` in
``csrc/cpu/comm/shm.cpp`` is never called). Each run on a new port therefore leaves ~66 MiB per rank
in ``/dev/shm``, which is RAM: measured here, 308 buffers (20 GiB of 24 GiB) after a day of test
runs, until the compiler building a JIT op was OOM-killed.

The POSIX idiom fixes it: once every rank has mapped every buffer (a barrier after the process
group is joined), each rank unlinks its own name; the memory lives on while mapped and is freed
when the last rank exits, however it exits. ``leftovers`` finds buffers that no live process maps
(left by stock DeepSpeed, or by a rank killed before the barrier); ``remove_leftovers`` deletes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

SHM_DIR = "/dev/shm"
PREFIX = "deepspeed_allreduce_buffer_"


def buffer_name(uid: int, master_addr: str, master_port: int | str, rank: int) -> str:
    """The name ``shm_initialize`` gives rank ``rank``'s buffer (pure; format from shm.cpp)."""
    return f"{PREFIX}{uid}_{master_addr}_{master_port}_{rank}"


def release_own_buffer(master_addr: str, master_port: int | str, rank: int, shm_dir: str = SHM_DIR) -> bool:
    """Unlink this rank's buffer name (call after a barrier: every rank has mapped it). True if one was there."""
    try:
        os.unlink(os.path.join(shm_dir, buffer_name(os.getuid(), master_addr, master_port, rank)))
        return True
    except FileNotFoundError:  # no shm op (GPU, ranks across hosts) or already released
        return False


@dataclass(frozen=True)
class Leftover:
    path: str
    size_bytes: int


def leftovers(shm_dir: str = SHM_DIR, proc: str = "/proc") -> list[Leftover]:
    """This user's DeepSpeed buffers in ``shm_dir`` that no process maps: nothing can use them again."""
    try:
        names = sorted(n for n in os.listdir(shm_dir) if n.startswith(PREFIX))
    except OSError:
        return []
    mapped = mapped_paths(proc)
    found = []
    for name in names:
        path = os.path.join(shm_dir, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            continue
        if st.st_uid == os.getuid() and os.path.realpath(path) not in mapped:
            found.append(Leftover(path, st.st_size))
    return found


def mapped_paths(proc: str = "/proc") -> set[str]:
    """Every file path some readable process has mapped (``/proc/PID/maps``)."""
    paths: set[str] = set()
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "maps")) as f:
                for line in f:
                    parts = line.split(maxsplit=5)
                    if len(parts) == 6 and parts[5].startswith("/"):
                        paths.add(parts[5].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:  # gone, or not ours to read
            continue
    return paths


def remove_leftovers(shm_dir: str = SHM_DIR, proc: str = "/proc") -> list[Leftover]:
    """Delete ``leftovers``; returns what was removed."""
    removed = []
    for item in leftovers(shm_dir, proc):
        try:
            os.unlink(item.path)
            removed.append(item)
        except FileNotFoundError:
            continue
    return removed
