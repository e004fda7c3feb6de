"""This rank's place in the process group: join it (export the rendezvous through ``ds_bench.machine.environ``,
check the master is reachable, ``deepspeed.init_distributed``, pick the device), the ``DistState`` every later
stage reads, and ``gather``, the one all-gather of Python objects the commands use.

What to export is decided by ``ds_bench.cluster.rendezvous`` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT and the socket-interface variables); with all five set, ``deepspeed.init_distributed``
skips its own MPI discovery, whose ``hostname -I`` choice of master address is the bug users
patch by hand. How the process ends once it joined is ``ds_bench.cluster.process_exit``'s.
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


def joined() -> bool:
    """Whether this process joined a process group (``init_distributed`` returned)."""
    return _state["initialized"]


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
