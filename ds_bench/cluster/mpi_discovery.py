"""Completing a ``RankInfo`` through MPI collectives (mpi4py): local rank and size and node rank
from the processor names, the master address chosen by rank 0 and broadcast. Not pure: every rank
calls it, and a missing rank is reported after a timed barrier, never waited for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from ds_bench.cluster.discovery import RankInfo
from ds_bench.errors import UserError


def _wait_for_all(comm, timeout_s: float) -> None:
    """Barrier that gives up after ``timeout_s`` instead of hanging on a missing rank."""
    request = comm.Ibarrier()
    deadline = time.monotonic() + timeout_s
    while not request.Test():
        if time.monotonic() > deadline:
            raise UserError(f"MPI: not every rank arrived within {timeout_s:g}s; "
                            "check that all ranks were started by the same mpirun/srun")
        time.sleep(0.01)


def complete_with_mpi(info: RankInfo, choose_master: Callable[[bool], tuple[str, int]],
                      timeout_s: float) -> RankInfo:
    """Fill the fields ``info`` lacks from MPI_COMM_WORLD; every rank must call this.

    Local rank/size and node rank come from grouping equal processor names. Rank 0 then picks
    the master address and port (``choose_master(spans_hosts)``, only where the environment gave
    none) and broadcasts them; if it fails, its error is broadcast instead, so no rank is left
    waiting. Values already in ``info`` are kept; rank and world size must match MPI's, which
    catches ranks started as separate one-process MPI worlds. The first collective is a timed
    barrier, so a missing rank is reported, not waited for.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if info.rank not in (None, rank) or info.world_size not in (None, size):
        raise UserError(f"MPI: COMM_WORLD says rank {rank} of {size} but the environment "
                        f"({info.source}) says rank {info.rank} of {info.world_size}")
    _wait_for_all(comm, timeout_s)
    names = comm.allgather(MPI.Get_processor_name())
    nodes = list(dict.fromkeys(names))  # node order = order of each node's lowest rank
    mine = names[rank]
    offer = _master_offer(info, choose_master, len(nodes) > 1) if rank == 0 else None
    status, master = comm.bcast(offer, root=0)
    if status == "error":
        raise UserError(master if rank == 0 else f"rank 0 could not choose a master address: {master}")
    return replace(
        info, rank=rank, world_size=size,
        local_rank=_keep(info.local_rank, names[:rank].count(mine)),
        local_world_size=_keep(info.local_world_size, names.count(mine)),
        node_rank=_keep(info.node_rank, nodes.index(mine)),
        master_addr=master[0], master_port=master[1], hosts=info.hosts or tuple(nodes),
    )


def _master_offer(info: RankInfo, choose_master: Callable[[bool], tuple[str, int]],
                  spans_hosts: bool) -> tuple[str, object]:
    try:
        addr, port = (info.master_addr, info.master_port)
        if addr is None or port is None:
            chosen_addr, chosen_port = choose_master(spans_hosts)
            addr, port = addr or chosen_addr, port or chosen_port
        return "ok", (addr, port)
    except UserError as e:
        return "error", str(e)


def _keep(value: int | None, fallback: int) -> int:
    return fallback if value is None else value
