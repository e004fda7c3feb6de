"""A device's measured ceiling: dense matmul TFLOP/s per dtype and copy bandwidth, and the lookup that
turns a run's achieved TFLOP/s into ``mfu_vs_measured``.

- matmul: ``torch.mm`` of two n x n matrices, 2 n^3 FLOPs each (the multiply-adds of the product counted
  as two operations, as datasheet peaks count them); one untimed warm-up product, then iterations doubled
  until one sample lasts ``min_time_s / repeats``, then ``repeats`` samples, each clock read after the
  device is synchronized. TFLOP/s = 2 n^3 x iterations / seconds / 1e12; median, min and max over samples.
- gemm: ``torch.mm`` of (m x k) by (k x n), 2 m k n FLOPs, sampled the same way: a run's own shapes
  (``ds_bench.workloads.gpt2_shapes.gemms``), whose rate can sit well below the square ceiling.
- copy: ``dst.copy_(src)`` of ``nbytes``; GB/s = 2 x nbytes (read once, written once: the STREAM "copy"
  convention, McCalpin) x iterations / seconds / 1e9, sampled the same way.

On CPU ranks every rank of the job measures at the same time (the caller puts a barrier before each
test), so each figure is what a rank gets while the others work, as in a run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
MAX_ITERS = 1 << 16


@dataclass(frozen=True)
class Figure:
    """One measured rate: the median of ``repeats`` samples of ``iters`` operations each, and its spread."""

    median: float
    low: float
    high: float
    iters: int
    repeats: int


def sampled(op: Callable[[], None], work: float, sync: Callable[[], None], min_time_s: float, repeats: int) -> Figure:
    """Rates (``work`` units per operation / seconds) of ``op``, timed as the module docstring says."""
    op()
    sync()
    iters, target = 1, min_time_s / repeats
    while True:
        seconds = _timed(op, iters, sync)
        if seconds >= target or iters >= MAX_ITERS:
            break
        iters *= 2
    rates = [work * iters / _timed(op, iters, sync) for _ in range(repeats)]
    return Figure(statistics.median(rates), min(rates), max(rates), iters, repeats)


def _timed(op: Callable[[], None], iters: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        op()
    sync()
    return time.perf_counter() - start


def matmul(n: int, dtype: str, device: torch.device, sync: Callable[[], None], min_time_s: float,
           repeats: int) -> Figure:
    """Dense n x n matmul rate in TFLOP/s."""
    gen = torch.Generator().manual_seed(n)
    a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=DTYPES[dtype]) for _ in range(2))
    out = torch.empty_like(a)
    return sampled(lambda: torch.mm(a, b, out=out), 2 * n**3 / 1e12, sync, min_time_s, repeats)


def gemm(m: int, k: int, n: int, dtype: str, device: torch.device, sync: Callable[[], None], min_time_s: float,
         repeats: int) -> Figure:
    """Dense (m x k) @ (k x n) rate in TFLOP/s."""
    gen = torch.Generator().manual_seed(m + k + n)
    a = torch.randn(m, k, generator=gen).to(device=device, dtype=DTYPES[dtype])
    b = torch.randn(k, n, generator=gen).to(device=device, dtype=DTYPES[dtype])
    out = torch.empty(m, n, device=device, dtype=DTYPES[dtype])
    return sampled(lambda: torch.mm(a, b, out=out), 2 * m * k * n / 1e12, sync, min_time_s, repeats)


def copy(nbytes: int, device: torch.device, sync: Callable[[], None], min_time_s: float, repeats: int) -> Figure:
    """Device memory copy rate in GB/s (bytes read + bytes written)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    return sampled(lambda: dst.copy_(src), 2 * src.numel() * 4 / 1e9, sync, min_time_s, repeats)


def measure_rank(where: dict, device: torch.device, dtypes: tuple, sizes: tuple, copy_bytes: int, min_time_s: float,
                 repeats: int, sync: Callable[[], None], barrier: Callable[[], None], gemms: tuple = ()) -> list[dict]:
    """This rank's rows (``where``: rank, host, device name), a barrier before each figure so every rank of
    the job measures while the others do. ``gemms``: (name, m, k, n) of a run's own products."""
    rows = []
    for dtype in dtypes:
        for n in sizes:
            barrier()
            rows.append({**where, "test": "matmul", "dtype": dtype, "size": n,
                         **vars(matmul(n, dtype, device, sync, min_time_s, repeats))})
        for name, m, k, n in gemms:
            barrier()
            rows.append({**where, "test": "gemm", "dtype": dtype, "size": m, "name": name, "shape": [m, k, n],
                         **vars(gemm(m, k, n, dtype, device, sync, min_time_s, repeats))})
    barrier()
    return rows + [{**where, "test": "copy", "dtype": "fp32", "size": copy_bytes,
                    **vars(copy(copy_bytes, device, sync, min_time_s, repeats))}]


def ceiling(rows: list[dict], host: str, device: str, dtype: str) -> float | None:
    """The best median matmul TFLOP/s measured on ``host``'s ``device`` in ``dtype`` (any size), or None.

    ``rows`` are one roofline record's ``results``; the caller picks the newest record of the host."""
    found = [r["median"] for r in rows
             if r["test"] == "matmul" and r["host"] == host and r["device"] == device and r["dtype"] == dtype]
    return max(found, default=None)
