"""Message sizes and bandwidths of the collectives, as nccl-tests defines them (pure).

Source: NVIDIA/nccl-tests ``doc/PERFORMANCE.md``. ``size`` is the bytes of the largest buffer of
the operation (all_gather: the gathered output; reduce_scatter: the input; all_to_all: one rank's
buffer), ``algbw = size / time`` and ``busbw = algbw x factor``, where the factor makes busbw
comparable with the link's hardware bandwidth whatever the collective and the rank count:

- all_reduce: 2(n-1)/n (a reduce-scatter then an all-gather, each moving (n-1)/n of the data);
- all_gather, reduce_scatter, all_to_all: (n-1)/n;
- broadcast, send/recv: 1.

GB/s is 1e9 bytes per second. DeepSpeed's comm benchmark reports all_reduce "throughput" as 2 x
algbw; ds_bench follows nccl-tests. Time, as nccl-tests' default (``-a 1``), is each rank's mean
time per iteration averaged over the ranks.
"""

from __future__ import annotations

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
SPLIT = ("all_gather", "reduce_scatter", "all_to_all")
"""Collectives whose buffer is split into one chunk per rank: counts are rounded down to a multiple of n."""


def bus_factor(collective: str, n: int) -> float:
    """busbw / algbw for ``collective`` over ``n`` ranks (nccl-tests PERFORMANCE.md)."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in SPLIT:
        return (n - 1) / n
    if collective in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; expected one of {', '.join(COLLECTIVES)}")


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / 1e9


def busbw_gbps(collective: str, n: int, size_bytes: int, seconds: float) -> float:
    return algbw_gbps(size_bytes, seconds) * bus_factor(collective, n)


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """``min_bytes``, x ``factor``, ... up to ``max_bytes`` (included when reached exactly)."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def element_count(collective: str, size_bytes: int, n: int, element_bytes: int) -> int:
    """Elements of the operation's largest buffer for ``size_bytes``: at least one per rank, and a
    multiple of ``n`` when the buffer is split into per-rank chunks (as nccl-tests rounds)."""
    count = max(1, size_bytes // element_bytes)
    if collective in SPLIT:
        count = max(n, count - count % n)
    return count
