"""The timed loop: one collective at one size on the joined process group, checked then timed.

Per (collective, size): build the buffers, run the operation once on ``patterns`` inputs and check
the result on this rank, then ``warmup`` untimed iterations, a barrier, and ``iters`` timed ones:
with CUDA events on the current stream on GPUs (no host sync inside the loop), with
``time.perf_counter`` on CPU ranks (gloo calls return when done). A rank's time is its mean per
iteration; ``main`` gathers every rank's times once per collective, after its sizes, so no
gathering happens between timed loops' barriers and what they time.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ds_bench.comm import patterns
from ds_bench.comm.bandwidth import element_count


@dataclass(frozen=True)
class RankSample:
    """One rank's result for one (collective, size)."""

    collective: str
    size_bytes: int
    count: int
    seconds: float
    wrong: str | None
    """The mismatch this rank saw (``patterns.describe_mismatch``), or None."""


def operation(collective: str, send: torch.Tensor, recv: torch.Tensor, rank: int, n: int,
              group=None) -> Callable[[], None]:
    """A no-argument callable that runs the collective once from ``send`` into ``recv``."""
    if collective == "all_reduce":
        return lambda: dist.all_reduce(recv, group=group)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(recv, send, group=group)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(recv, send, group=group)
    if collective == "broadcast":
        return lambda: dist.broadcast(recv, src=_global(group, 0), group=group)
    if collective == "all_to_all":
        return lambda: dist.all_to_all_single(recv, send, group=group)
    if collective == "send_recv":  # a ring: to the next rank, from the previous one
        return exchange(send, recv, _global(group, (rank + 1) % n), _global(group, (rank - 1) % n), group)
    raise ValueError(f"unknown collective {collective!r}")


def exchange(send: torch.Tensor, recv: torch.Tensor, to: int, source: int, group=None) -> Callable[[], None]:
    """Send ``send`` to global rank ``to`` while receiving ``recv`` from ``source``, both at once."""
    def run() -> None:
        for request in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, to, group),
                                               dist.P2POp(dist.irecv, recv, source, group)]):
            request.wait()
    return run


def _global(group, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)


def buffers(collective: str, rank: int, n: int, count: int, dtype: torch.dtype, device) -> tuple:
    """(send, recv) for one operation; all_reduce and broadcast work in place (send is recv)."""
    send = patterns.make_input(collective, rank, n, count, dtype, device)
    if collective in ("all_reduce", "broadcast"):
        return send, send
    recv_count = count // n if collective == "reduce_scatter" else count
    return send, torch.empty(recv_count, dtype=dtype, device=device)


def sample(collective: str, size_bytes: int, dtype: torch.dtype, device: torch.device, rank: int, n: int,
           warmup: int, iters: int, group=None) -> RankSample:
    """Check, then time, one collective at one size on this rank."""
    count = element_count(collective, size_bytes, n, torch.empty(0, dtype=dtype).element_size())
    send, recv = buffers(collective, rank, n, count, dtype, device)
    run = operation(collective, send, recv, rank, n, group)
    run()
    wrong = _check(collective, recv, rank, n, count, dtype, size_bytes)
    if collective == "all_reduce":
        recv.zero_()  # repeated in-place sums of the pattern would overflow; zeros cost the same to move
    for _ in range(warmup):
        run()
    seconds = _timed(run, iters, device, group)
    return RankSample(collective, count * send.element_size(), count, seconds, wrong)


def _check(collective, recv, rank, n, count, dtype, size_bytes) -> str | None:
    want = patterns.expected(collective, rank, n, count, dtype)
    index = patterns.first_mismatch(recv, want, dtype)
    if index is None:
        return None
    return patterns.describe_mismatch(collective, size_bytes, rank, n, count, index,
                                      float(recv[index]), float(want[index]))


def _timed(run: Callable[[], None], iters: int, device: torch.device, group) -> float:
    """A barrier over ``group``, then ``clock``."""
    dist.barrier(group=group)
    return clock(run, iters, device)


def clock(run: Callable[[], None], iters: int, device: torch.device) -> float:
    """Mean seconds per iteration of ``run`` on this rank, the clock read after the device finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    begin = time.perf_counter()
    for _ in range(iters):
        run()
    return (time.perf_counter() - begin) / iters
