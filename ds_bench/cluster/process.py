"""Process-level side effects of a run: exported environment, process group, device, exit.

This is the one module that writes ``os.environ`` and the one that ends the process. What to
export is decided by ``ds_bench.cluster.rendezvous`` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT and the socket-interface variables); with all five set, ``deepspeed.init_distributed``
skips its own MPI discovery, whose ``hostname -I`` choice of master address is the bug users
patch by hand.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from ds_bench.cluster.rendezvous import Rendezvous, wait_reachable
from ds_bench.machine import environ

if TYPE_CHECKING:
    import torch

log = logging.getLogger("ds_bench")

_state = {"initialized": False}


@dataclass(frozen=True)
class DistState:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str
    """Which discovery path found the ranks (``RankInfo.source``)."""
    device: torch.device
    backend: str
    rendezvous: dict


def init_distributed(rdzv: Rendezvous, timeout_s: float, connect_timeout_s: float) -> DistState:
    """Export the rendezvous, check the master is reachable, join the process group (every wait
    bounded by ``timeout_s``) and pick this rank's device."""
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    info = rdzv.info
    environ.export(rdzv.env)
    log.info("rendezvous: %s:%s via %s (%s); launcher %s, %d rank(s)", info.master_addr, info.master_port,
             rdzv.choice.name or "-", rdzv.choice.reason, info.source, info.world_size)
    if info.rank != 0:
        wait_reachable(rdzv, connect_timeout_s, timeout_s)
    # DeepSpeed calls torch's deprecated *_into_tensor aliases; the warning is not the user's to act on.
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    accel = get_accelerator()
    _limit_cpu_threads(accel.device_name(), info.local_world_size)
    backend = accel.communication_backend_name()
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # DeepSpeed prints "... built successfully" for a cached op
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False,
                                   timeout=timedelta(seconds=timeout_s))
    sys.stdout.write("".join(line for line in printed.getvalue().splitlines(keepends=True)
                             if not line.rstrip().endswith("built successfully")))
    _state["initialized"] = True
    released = None
    if accel.device_name() == "cpu":
        released = _release_shm_buffer(info.master_addr, info.master_port, info.rank)
    else:
        accel.set_device(info.local_rank)
    device = torch.device(accel.device_name(info.local_rank) if accel.device_name() != "cpu" else "cpu")
    return DistState(rank=info.rank, world_size=info.world_size, local_rank=info.local_rank,
                     local_world_size=info.local_world_size, master_addr=info.master_addr,
                     master_port=info.master_port, launcher=info.source, device=device, backend=backend,
                     rendezvous={**rdzv.describe(), "shm_buffer_released": released})


def _release_shm_buffer(master_addr: str, master_port: int, rank: int) -> bool:
    """Unlink this rank's DeepSpeed shm buffer once every rank has mapped every buffer (the barrier),
    so nothing stays in /dev/shm after the run, however it ends (``ds_bench.machine.shm`` says why). True when
    there was one (the record's ``rendezvous.shm_buffer_released``: DeepSpeed's shm all-reduce was on)."""
    import torch

    from ds_bench.machine.shm import release_own_buffer

    torch.distributed.barrier()
    return release_own_buffer(master_addr, master_port, rank)


def gather(obj):
    """Every rank's ``obj``, in rank order, on every rank (bounded by the process group's timeout)."""
    import torch

    out: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def _limit_cpu_threads(device_type: str, local_world_size: int | None) -> None:
    """On CPU ranks, share the cores: N ranks on the C cores this process may use (its affinity,
    e.g. a Slurm cpuset) get C // N intra-op threads each. OMP_NUM_THREADS, when set (torchrun sets
    1), wins; the count used is recorded in ``hardware.torch_threads``."""
    if device_type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        import torch

        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // max(1, local_world_size or 1)))


def _end_daemon_children(timeout_s: float = 5.0) -> None:
    """What ``os._exit`` skips of ``multiprocessing``'s own exit: its daemon children ended. DeepSpeed's
    ZenFlow (``overlap_step``) runs the optimizer in one per rank; left alive it outlived the run and held
    the launcher's stdout open (a caller reading it to the end waited for ever)."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    children = [child for child in mp.active_children() if child.daemon]
    for child in children:
        child.terminate()
    for child in children:
        child.join(timeout_s)
        if child.is_alive():  # it ignored SIGTERM
            child.kill()


def exit_process(code: int) -> None:
    """End the process without the interpreter's teardown.

    - gloo worker threads can free tensors while the interpreter shuts down, killing ~1 in 10
      two-rank CPU runs with SIGABRT after all work is done (measured with deepspeed 0.19.8 and
      torch 2.13 on CPU ranks). So after a
      distributed run: destroy the process group, end daemon children, finalize MPI, flush, and ``os._exit``. The
      results file was fsync'ed before this point, so nothing is lost.
    - Under MPI a failing rank must not ``MPI_Finalize``: Open MPI's Finalize waits for every rank,
      so one bad rank would hold the job until rank 0's timeout. It calls ``Abort`` instead, which
      ends the whole job at once (measured in the two-host namespace test: ~5 s instead of ~70 s).
    """
    mpi = _live_mpi()
    if not _state["initialized"] and mpi is None:
        sys.exit(code)
    if code == 0 and _state["initialized"]:
        _destroy_process_group()
    _end_daemon_children()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if mpi is not None:
        if code != 0 and mpi.COMM_WORLD.Get_size() > 1:
            mpi.COMM_WORLD.Abort(code)
        mpi.Finalize()
    os._exit(code)


def _destroy_process_group() -> None:
    import torch

    try:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    except Exception as e:  # teardown trouble must not turn a good run into a failed one
        log.warning("destroy_process_group failed: %s", e)


def _live_mpi():
    """mpi4py's MPI module when this process initialised MPI and has not finalised it."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi
    return None
