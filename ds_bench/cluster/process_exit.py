"""How a ds_bench process ends: ``exit_process``, the one way out of a command (``ds_bench.cli``) and of a rank
whose step watchdog fired, without the interpreter's teardown once a process group was joined
(``ds_bench.cluster.process_group``) or MPI initialised.
"""

from __future__ import annotations

import logging
import os
import sys

from ds_bench.cluster.process_group import joined

log = logging.getLogger("ds_bench")


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
    if not joined() and mpi is None:
        sys.exit(code)
    if code == 0 and joined():
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
