"""DeepSpeed's JIT-compiled ops: one toolchain, one build folder per environment, one build per op.

DeepSpeed compiles ``deepspeed_shm_comm`` on CPU ranks at the first ``init_distributed`` (~30-65 s
on 2 cores) and ``cpu_adam`` / ``fused_adam`` at the first run that needs them, through torch's
``cpp_extension.load``, which runs whichever ``ninja`` is first on PATH in a folder under
TORCH_EXTENSIONS_DIR. Three traps, measured on this project's machines:

- Two ninja versions (the venv's pip ``ninja`` and the system's) write incompatible ``.ninja_log``
  files, so runs started with different PATHs (the deepspeed launcher puts the venv first, a bare
  ``.venv/bin/python`` does not) rebuild each other's op on almost every run. ``ds_bench.machine.toolchain``
  puts the ninja beside the interpreter first on PATH, whatever PATH the process was started with.
- Two environments (checkouts, venvs, torch or DeepSpeed versions) sharing one folder rebuild each
  other's ops (the build file embeds the include paths). Unless the user set TORCH_EXTENSIONS_DIR,
  each environment gets its own folder, keyed by interpreter prefix, torch, DeepSpeed and ninja;
  a CPU op built once is kept in ``ds_bench.machine.op_store`` by content, so the next environment of
  the same versions, CPU and compiler loads it instead of compiling it again.
- torch guards a build with a ``lock`` file that a killed build leaves behind; every later load
  then waits on it forever. ``ensure_loaded`` serialises ds_bench's loads of an op with a kernel
  lock (released when its holder dies), so a ``lock`` file seen while holding it, with no process
  working in the folder, is stale: it is removed with a warning.

``ensure_loaded`` runs before the process group is joined, so a first-run compile never eats
into the rendezvous timeouts. ``python -m ds_bench.machine.op_builds`` builds (or loads from the store)
the CPU ops up front (``make``),
after removing DeepSpeed shm buffers that no process maps (``ds_bench.machine.shm``): they are RAM, and
a compile needs ~2 GB of it.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import time
from collections.abc import Iterator

from ds_bench.config.deepspeed.optim import offloads_optimizer
from ds_bench.machine import op_store
from ds_bench.machine.locks import file_lock

log = logging.getLogger("ds_bench")

BUILDERS = {"deepspeed_shm_comm": "ShareMemCommBuilder", "cpu_adam": "CPUAdamBuilder",
            "cpu_adagrad": "CPUAdagradBuilder", "cpu_lion": "CPULionBuilder", "fused_adam": "FusedAdamBuilder"}
OFFLOAD_OPS = {"adagrad": "cpu_adagrad", "lion": "cpu_lion"}
"""Optimizer offload's CPU op by optimizer type (DeepSpeed's ``_configure_basic_optimizer``); else cpu_adam."""
CPU_OPS = ("deepspeed_shm_comm", "cpu_adam")
"""What ``python -m ds_bench.machine.op_builds`` builds: the comm op every CPU run needs, and optimizer offload's."""
STALE_AFTER_S = 10.0
"""A build ``lock`` this old, with no process working in its folder, was left by a killed build."""
WAIT_FOR_BUILD_S = 1800.0
"""How long a rank waits for another process's build of the same op before giving up."""


def build_dir(op_name: str) -> str:
    from torch.utils import cpp_extension

    return cpp_extension._get_build_directory(op_name, verbose=False)


def is_built(op_name: str) -> bool:
    return bool(glob.glob(os.path.join(build_dir(op_name), f"{op_name}*.so")))


def is_stored(op_name: str) -> bool:
    """Whether the op store holds this CPU op for this environment (``ds_bench.machine.op_store``)."""
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder(BUILDERS[op_name])
    return builder is not None and os.path.isfile(stored_path(builder, op_name))


def announce_cpu_builds(device_type: str, optimizer_op: str | None) -> None:
    """Tell the user, before the silence, that the first run compiles DeepSpeed ops."""
    if device_type != "cpu":
        return
    names = ["deepspeed_shm_comm"] + ([optimizer_op] if optimizer_op else [])
    missing = [n for n in names if not is_built(n) and not is_stored(n)]
    if missing:
        log.warning("first run on this machine: DeepSpeed compiles %s (~30-60 s each, once; cached in %s)",
                    ", ".join(missing), os.path.dirname(build_dir(missing[0])))


def optimizer_op(ds_cfg: dict) -> str | None:
    """The optimizer op DeepSpeed will JIT-compile for a resolved config (pure): with optimizer
    offload (cpu or nvme) the CPU op of its type (no optimizer section: ds_bench's default
    DeepSpeedCPUAdam); fused_adam for Adam/AdamW without ``torch_adam``; none otherwise."""
    optimizer = ds_cfg.get("optimizer") or {}
    kind = str(optimizer.get("type", "")).lower()
    if offloads_optimizer(ds_cfg):
        return OFFLOAD_OPS.get(kind, "cpu_adam")
    if kind in ("adam", "adamw") and not (optimizer.get("params") or {}).get("torch_adam"):
        return "fused_adam"
    return None


def ops_for_run(device_type: str, optimizer_op: str | None) -> tuple[str, ...]:
    """The JIT ops a run will load: the shared-memory comm op on CPU ranks, and its optimizer's."""
    return (("deepspeed_shm_comm",) if device_type == "cpu" else ()) + ((optimizer_op,) if optimizer_op else ())


def spawned_process_ops(ds_cfg: dict) -> tuple[str, ...]:
    """The ops a process DeepSpeed spawns will load by itself (pure): ZenFlow's overlapped optimizer process
    (``zero_optimization.zenflow.overlap_step``) calls ``CPUAdamBuilder().load()`` in a ``spawn`` child, which
    inherits no op this process loaded, so it finds cpu_adam only as a build in this environment's folder."""
    zenflow = (ds_cfg.get("zero_optimization") or {}).get("zenflow") or {}
    return ("cpu_adam",) if zenflow.get("overlap_step") else ()


def ensure_built_in_folder(op_names: tuple[str, ...], wait_s: float = WAIT_FOR_BUILD_S) -> None:
    """Each op built in this environment's folder, where a spawned process's own load finds it up to date (one
    compiled here is loaded from there). An op the store holds is not built there, so without this ZenFlow's optimizer process
    compiled cpu_adam itself, pinned to one core, in the middle of a measured step: 165 s of a 2-rank run (AMD
    EPYC, 2 cores, 2026-11-26), past the test's 300 s with another run beside it. Call it before
    ``ensure_loaded``: a process that has loaded the stored copy cannot load the built one too."""
    for name, builder, folder in _not_loaded_yet(op_names, wait_s):
        if not is_built(name):
            log.warning("compiling DeepSpeed op %s in %s, where a process DeepSpeed spawns loads it from "
                        "(ZenFlow's optimizer process; once per environment)", name, folder)
            builder.load(verbose=False)


def ensure_loaded(op_names: tuple[str, ...], wait_s: float = WAIT_FOR_BUILD_S) -> None:
    """Load each op into this process before DeepSpeed asks for it: a CPU op from the store
    (``ds_bench.machine.op_store``) when it holds one, else built once here (and a CPU op then stored).
    DeepSpeed reuses the loaded module (``OpBuilder._loaded_ops``)."""
    from deepspeed.accelerator import get_accelerator

    on_cpu = get_accelerator().device_name() == "cpu"
    for name, builder, folder in _not_loaded_yet(op_names, wait_s):
        stored = stored_path(builder, name) if on_cpu else None
        if stored and _load_stored(builder, name, stored):
            continue
        if not is_built(name):
            log.warning("compiling DeepSpeed op %s in %s (once per environment)", name, folder)
        builder.load(verbose=False)
        built = os.path.join(folder, f"{name}.so")
        if stored and os.path.isfile(built):
            op_store.keep(built, stored)


def _not_loaded_yet(op_names: tuple[str, ...], wait_s: float) -> Iterator[tuple[str, object, str]]:
    """(name, builder, build folder) of each op this process has not loaded, each under ds_bench's lock on its
    folder, a stale torch build lock there cleared."""
    from deepspeed.accelerator import get_accelerator

    for name in op_names:
        builder = get_accelerator().create_op_builder(BUILDERS[name])
        if builder is None or name in _loaded_ops(builder):
            continue  # once per process: another file's copy would register its torch ops again (an abort)
        folder = build_dir(name)
        with _op_lock(folder, name, wait_s):
            _clear_stale_lock(folder, wait_s)
            yield name, builder, folder


def stored_path(builder, name: str) -> str:
    """Where the op store keeps this CPU op as this environment would build it."""
    import deepspeed
    import torch

    return op_store.path_for(name, [builder.deepspeed_src_path(p) for p in builder.sources()],
                             [builder.deepspeed_src_path(p) for p in builder.include_paths()],
                             (torch.__version__, deepspeed.__version__))


def _load_stored(builder, name: str, path: str) -> bool:
    """Import a stored op and hand it to DeepSpeed; False (the file removed) when there is none, or
    when it does not load (then the caller builds it again)."""
    if not os.path.isfile(path):
        return False
    try:
        module = op_store.load(name, path)
    except (ImportError, OSError) as exc:
        log.warning("stored DeepSpeed op %s does not load (%s); removing it and building the op", path, exc)
        with contextlib.suppress(OSError):
            os.unlink(path)
        return False
    _loaded_ops(builder)[name] = module
    return True


def _loaded_ops(builder) -> dict:
    """DeepSpeed's ``OpBuilder._loaded_ops``: the ops this process has loaded, by name."""
    return next(vars(c)["_loaded_ops"] for c in type(builder).__mro__ if "_loaded_ops" in vars(c))


@contextlib.contextmanager
def _op_lock(folder: str, name: str, wait_s: float) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder/ds_bench.lock``: one ds_bench process loads an op at a time."""
    path = os.path.join(folder, "ds_bench.lock")
    with file_lock(path, wait_s) as held:
        if not held:
            raise RuntimeError(f"could not take {path} within {wait_s:g} s: another process is building "
                               f"DeepSpeed op {name}, or this file system has no flock")
        yield


def is_stale(lock_age_s: float, workers: list[int]) -> bool:
    """A torch build lock is stale when no process works in its folder and it is not brand new."""
    return not workers and lock_age_s > STALE_AFTER_S


def _clear_stale_lock(folder: str, wait_s: float) -> None:
    """Remove torch's ``lock`` when its build is dead; wait (bounded) while a live one finishes."""
    lock = os.path.join(folder, "lock")
    deadline = time.monotonic() + wait_s
    while True:
        try:
            age = time.time() - os.stat(lock).st_mtime
        except FileNotFoundError:
            return
        if is_stale(age, processes_working_in(folder)):
            os.unlink(lock)
            log.warning("removed a stale build lock %s (%.0f s old, no process building there: a killed build "
                        "left it)", lock, age)
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{lock}: a build has held this lock for {age:.0f} s; if no build is running, "
                               "remove the file")
        time.sleep(1.0)


def processes_working_in(folder: str, proc: str = "/proc") -> list[int]:
    """PIDs whose current directory is ``folder``: torch runs ninja and the compiler there."""
    real = os.path.realpath(folder)
    pids = []
    for entry in os.listdir(proc):
        if entry.isdigit():
            try:
                if os.readlink(os.path.join(proc, entry, "cwd")) == real:
                    pids.append(int(entry))
            except OSError:  # gone, or not ours to read
                continue
    return pids
