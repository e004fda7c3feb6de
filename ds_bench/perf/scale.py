"""``ds-bench plan --scale``: per candidate layout, the largest member of a model family that fits the device
(pure): more blocks (``layers``), a wider model (``hidden``), or a longer sequence (``seq``), each from the same
memory model as the plan (``perf.memory``), and its predicted throughput at that size (``perf.step``).

- **layers**: blocks in steps of the pipeline stages, the width and heads kept.
- **hidden**: the width in steps of whole heads (the head width kept; heads, KV heads and the MLP width scaled
  with it by the caller's ``resize``: as ``ds-bench run --hidden H --heads H/d`` builds a custom shape), every
  value the layout's TP and SP must divide.
- **seq**: the sequence in steps of ``SEQ_STEP`` x SP tokens; one sequence per data-parallel replica per step
  (micro-batch 1, no accumulation), as long-context runs are measured (ALST: Bekman et al. 2025); GPT-2's learned
  positions grow with it.

The largest value is found by doubling, then bisection, on "its predicted memory is within the device's less the
headroom, its offloaded states within the host's (``perf.space.overflow``), and the model can be split so"
(``perf.space.model_reason``): memory grows with each axis. A layout that cannot hold the family's smallest member
has no answer; one that holds ``LIMIT`` is answered at it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from ds_bench.perf import memory as mem
from ds_bench.perf.candidate import Candidate
from ds_bench.perf.devices import Cluster
from ds_bench.perf.shapes import Transformer
from ds_bench.perf.space import Planned, Space, model_reason, overflow, predicted

AXES = ("layers", "hidden", "seq")
SEQ_STEP = 256
LIMIT = {"layers": 1 << 12, "hidden": 1 << 17, "seq": 1 << 24}
"""The largest value searched per axis (4,096 blocks, a 131,072 width, 16M tokens)."""

Resize = Callable[[Transformer, str, int], Transformer]


@dataclass(frozen=True)
class Scaled:
    planned: Planned
    axis: str
    value: int
    shape: Transformer
    seq_len: int
    sequences: int
    capped: bool = False
    """It fit at ``LIMIT``: the largest is at least ``value``."""


def unit(shape: Transformer, axis: str, c: Candidate) -> int:
    """The axis' step for ``c``: the pipeline stages' blocks, TP x SP whole KV groups of heads, SP x 256 tokens."""
    layout = c.layout
    if axis == "layers":
        return layout.pipeline_stages
    if axis == "hidden":
        return shape.head_dim * (shape.heads // shape.kv_heads) * layout.tensor_parallel * layout.sequence_parallel
    return SEQ_STEP * layout.sequence_parallel


def largest(shape: Transformer, c: Candidate, cluster: Cluster, space: Space, axis: str, seq_len: int,
            sequences: int, workload_cls, resize: Resize) -> Scaled | None:
    """The largest member along ``axis`` that ``c`` fits (module docstring), or None when even one step does not;
    ``sequences``: per step (``seq``: one per replica, whatever is given)."""
    step = unit(shape, axis, c)
    if axis == "seq":
        c = dataclasses.replace(c, layout=dataclasses.replace(c.layout, micro_batch=1, grad_accum=1))
        sequences = c.replicas(cluster.world)

    def member(n: int) -> tuple[Transformer, int]:
        value = n * step
        if axis != "seq":
            return resize(shape, axis, value), seq_len
        return (dataclasses.replace(shape, positions=max(shape.positions, value)) if shape.positions else shape), value

    def fits(n: int) -> bool:
        s, t = member(n)
        if model_reason(s, c.layout, t, workload_cls):
            return False
        eager = space.eager or c.layout.attn == "eager"
        return overflow(mem.memory(s, c, t, cluster, eager, space.loss), cluster, space) is None

    if not fits(1):
        return None
    lo, hi, top = 1, 2, max(1, LIMIT[axis] // step)
    while hi <= top and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, top + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    s, t = member(lo)
    return Scaled(predicted(s, c, cluster, space, t, sequences), axis, lo * step, s, t, sequences, lo == top)


def scale(shape: Transformer, kept: list[Candidate], cluster: Cluster, space: Space, axis: str, seq_len: int,
          sequences: int, workload_cls, resize: Resize) -> list[Scaled]:
    """Each candidate's largest member, largest first, then the most tokens/s per rank there, then the least
    memory; candidates that hold none are left out."""
    if axis == "seq":  # one sequence per replica: a layout's micro-batch variants are one candidate
        kept = list({(dataclasses.replace(c.layout, micro_batch=1, grad_accum=1), c.checkpointing,
                      c.checkpoint_offload, c.selective): c for c in kept}.values())
    out = [s for c in kept if (s := largest(shape, c, cluster, space, axis, seq_len, sequences, workload_cls, resize))]
    out.sort(key=lambda s: (-s.value, -s.planned.tokens_per_s_per_rank, s.planned.memory.total))
    return out
