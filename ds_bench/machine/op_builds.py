"""DeepSpeed's CPU ops built (or loaded from the op store) up front, before any run needs them:
``python -m ds_bench.machine.op_builds`` (``make``). How an op is built, loaded and stored is
``ds_bench.machine.jit_ops``'; leftover DeepSpeed shm buffers are removed first (``ds_bench.machine.shm``:
they are RAM, and a compile needs ~2 GB of it). Where the cores allow, the ops missing are built at once, each by
a process of its own (``builds_at_once``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from ds_bench.machine import jit_ops

BUILD_JOBS_PER_OP = 2
"""Compiler jobs of one CPU op's build (its sources: shm.cpp + shm_interface.cpp; cpu_adam.cpp + cpu_adam_impl.cpp),
which ninja runs at once."""


BUILD_BYTES_PER_OP = 2 * 2**30
"""Memory one build needs at its peak (two compilers of torch's headers, ~0.6 GiB each, with room to spare)."""


def builds_at_once(cores: int, builds: int, available_bytes: int) -> bool:
    """Whether ``build_all`` compiles its ops in parallel processes (pure): only where there are cores for every
    build's compiler jobs, and memory for every build. On 2 cores (AMD EPYC, 2026-11-26) the two CPU ops took 102 s
    at once against 84 s one after the other."""
    return builds > 1 and cores >= BUILD_JOBS_PER_OP * builds and available_bytes >= BUILD_BYTES_PER_OP * builds


def build_all() -> None:
    from ds_bench.machine.shm import SHM_DIR, remove_leftovers

    if not _prepare():
        return
    removed = remove_leftovers()
    if removed:
        print(f"[ds_bench.machine.op_builds] removed {len(removed)} leftover DeepSpeed shm buffer(s) from {SHM_DIR} "
              f"({sum(r.size_bytes for r in removed) / 2**30:.2f} GiB of RAM; ds_bench.machine.shm says why)", flush=True)
    for name in jit_ops.CPU_OPS:
        state = ("from the op store" if jit_ops.is_stored(name)
                 else f"cached in {jit_ops.build_dir(name)}" if jit_ops.is_built(name)
                 else f"compiling (~30-60 s) in {jit_ops.build_dir(name)}")
        print(f"[ds_bench.machine.op_builds] {name}: {state}", flush=True)
    missing = [n for n in jit_ops.CPU_OPS if not jit_ops.is_built(n) and not jit_ops.is_stored(n)]
    forced = os.environ.get("DS_BENCH_OP_BUILDS_AT_ONCE") == "1" and len(missing) > 1
    room = psutil.virtual_memory().available
    if forced or builds_at_once(len(os.sched_getaffinity(0)), len(missing), room):
        print(f"[ds_bench.machine.op_builds] building {', '.join(missing)} at once", flush=True)
        _build_in_parallel(missing)
    for name in jit_ops.CPU_OPS:
        jit_ops.ensure_loaded((name,))


def _prepare() -> bool:
    """Logging, the JIT toolchain and the accelerator, as a run sets them; whether this is a CPU machine."""
    from ds_bench.logs import setup_logging
    from ds_bench.machine.environ import pin_jit_toolchain, select_accelerator

    setup_logging()
    pin_jit_toolchain()
    select_accelerator()
    from deepspeed.accelerator import get_accelerator

    return get_accelerator().device_name() == "cpu"


def _build_in_parallel(names: list[str]) -> None:
    """Each op built (and stored) by a process of its own, all at once; raises when one fails or outlasts
    ``jit_ops.WAIT_FOR_BUILD_S``."""
    procs = {n: subprocess.Popen([sys.executable, "-m", "ds_bench.machine.op_builds", "--op", n]) for n in names}
    deadline = time.monotonic() + jit_ops.WAIT_FOR_BUILD_S
    try:
        failed = [n for n, p in procs.items() if p.wait(timeout=max(1.0, deadline - time.monotonic())) != 0]
    except subprocess.TimeoutExpired:
        failed = [n for n, p in procs.items() if p.poll() != 0]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    if failed:
        raise RuntimeError(f"building DeepSpeed op(s) {', '.join(failed)} failed (their output is above)")


def main(argv: list[str]) -> None:
    """Every CPU op; ``--op NAME``: that one (``build_all``'s workers). ``DS_BENCH_OP_BUILDS_AT_ONCE=1`` builds the
    missing ones at once whatever the cores (how tests/test_ops.py takes the parallel path on 2 cores)."""
    if argv[:1] == ["--op"] and len(argv) == 2 and argv[1] in jit_ops.BUILDERS:
        if _prepare():
            jit_ops.ensure_loaded((argv[1],))
        return
    if argv:
        raise SystemExit(f"usage: python -m ds_bench.machine.op_builds [--op {'|'.join(jit_ops.BUILDERS)}]")
    build_all()


if __name__ == "__main__":
    main(sys.argv[1:])
