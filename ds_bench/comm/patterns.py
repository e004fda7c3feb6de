"""Inputs whose exact collective result is known, and the check every rank runs (as nccl-tests ``-c``).

Rank ``r``'s element ``i`` is ``((7r + i) mod 13) + 1``: small integers, so sums over ranks are
exact in fp32/fp64 and in fp16/bf16 up to 2048/256 (13 x ranks), and a value misplaced by a chunk,
a rank or an element shows. The expected output of each collective follows from its definition:

- all_reduce (sum): element i = sum over ranks s of v(s, i);
- all_gather: chunk s = rank s's input;
- reduce_scatter (sum): rank r gets sum over s of v(s, r x chunk + i);
- broadcast from rank 0: v(0, i) everywhere;
- all_to_all: rank r's chunk s = rank s's chunk r, i.e. v(s, r x chunk + i);
- send_recv (a ring: every rank sends to r+1 and receives from r-1): v(r-1, i).

``DS_BENCH_COMM_CORRUPT=RANK`` (a test-only switch) makes that rank add 1 to its first input
element, so the check can be seen to catch a wrong contribution.
"""

from __future__ import annotations

import os

import torch

CORRUPT_ENV = "DS_BENCH_COMM_CORRUPT"
TOLERANCE = {torch.float16: 1e-3, torch.bfloat16: 8e-3}
"""Relative tolerance for half types once sums pass their exact-integer range; exact otherwise."""


def values(rank: int, index: torch.Tensor) -> torch.Tensor:
    return ((7 * rank + index) % 13) + 1


def make_input(collective: str, rank: int, n: int, count: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Rank ``rank``'s send buffer (``count`` is the largest buffer's element count)."""
    size = count // n if collective == "all_gather" else count
    if collective == "broadcast" and rank != 0:
        return torch.zeros(size, dtype=dtype, device=device)
    tensor = values(rank, torch.arange(size, device=device)).to(dtype)
    if os.environ.get(CORRUPT_ENV) == str(rank):
        tensor[0] += 1
    return tensor


def expected(collective: str, rank: int, n: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """What rank ``rank``'s receive buffer must hold afterwards (on CPU, in float64)."""
    chunk = count // n
    if collective == "all_reduce":
        index = torch.arange(count)
        return sum(values(s, index) for s in range(n)).double()
    if collective == "all_gather":
        return torch.cat([values(s, torch.arange(chunk)) for s in range(n)]).double()
    if collective == "reduce_scatter":
        index = rank * chunk + torch.arange(chunk)
        return sum(values(s, index) for s in range(n)).double()
    if collective == "broadcast":
        return values(0, torch.arange(count)).double()
    if collective == "all_to_all":
        return torch.cat([values(s, rank * chunk + torch.arange(chunk)) for s in range(n)]).double()
    if collective == "send_recv":
        return values((rank - 1) % n, torch.arange(count)).double()
    raise ValueError(f"unknown collective {collective!r}")


def first_mismatch(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> int | None:
    """Index of the first element of ``got`` that differs from ``want`` (beyond the dtype's
    tolerance), or None when all agree."""
    got = got.detach().to("cpu", torch.float64)
    rtol = TOLERANCE.get(dtype, 0.0)
    bad = (got - want).abs() > rtol * want.abs()
    if bad.any():
        return int(bad.nonzero()[0, 0])
    return None


def describe_mismatch(collective: str, size_bytes: int, rank: int, n: int, count: int, index: int,
                      got: float, want: float) -> str:
    """One line naming the collective, the size, the rank that saw it and, for chunked results,
    the rank whose chunk is wrong."""
    source = ""
    if collective in ("all_gather", "all_to_all"):
        source = f" (the chunk from rank {index // (count // n)})"
    return (f"{collective} of {size_bytes} B: rank {rank} got {got:g} instead of {want:g} at element "
            f"{index}{source}")
