"""One way to join the ranks, for every command that meets them (``run``, ``doctor``, ``comm``).

Two halves, so a command can check its own input between them and bad input never joins:
``find_rendezvous`` (this process only: the JIT toolchain, the accelerator, where and how the ranks meet)
and ``join`` (the JIT ops loaded, built once if needed, so a first-run compile never eats into the
rendezvous timeouts; an optional memory cap; then the process group).
"""

from __future__ import annotations

import os
import time

from ds_bench.cluster import process_group, rendezvous
from ds_bench.machine import environ, jit_ops, memory


def find_rendezvous(iface: str | None, dist_timeout_s: float) -> rendezvous.Rendezvous:
    """Pin the toolchain, name the accelerator and resolve the rendezvous (no network wait)."""
    environ.pin_jit_toolchain()
    environ.select_accelerator()
    return rendezvous.resolve(os.environ, iface, dist_timeout_s)


def join(rdzv: rendezvous.Rendezvous, dist_timeout_s: float, connect_timeout_s: float,
         optimizer_op: str | None = None, memory_cap: int | None = None, took: dict | None = None,
         spawned_ops: tuple[str, ...] = ()) -> process_group.DistState:
    """Build the ops DeepSpeed's spawned processes load (``spawned_ops``), load the ops this process needs,
    cap its memory (after the builds: the compilers are not the run), and join the process group, every wait
    bounded; ``took`` gets ``ops_s`` and ``process_group_s``."""
    started = time.perf_counter()
    device_type = environ.device_type()
    jit_ops.announce_cpu_builds(device_type, optimizer_op)
    jit_ops.ensure_built_in_folder(spawned_ops)
    jit_ops.ensure_loaded(jit_ops.ops_for_run(device_type, optimizer_op))
    if memory_cap:
        memory.refuse_cap_below_held(memory_cap)  # after the builds, which the cap does not cover
        memory.cap_process_memory(memory_cap)
    loaded = time.perf_counter()
    state = process_group.init_distributed(rdzv, dist_timeout_s, connect_timeout_s)
    if took is not None:
        took.update(ops_s=loaded - started, process_group_s=time.perf_counter() - loaded)
    return state
