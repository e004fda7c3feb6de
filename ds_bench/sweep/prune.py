"""``sweep --prune-predicted``: rank a sweep's grid by ``ds-bench plan``'s model and say what it skips (pure).

It owns three things: which ``plan`` record a sweep may use (``pick_plan``: the newest whose workload, size and
world size are the sweep's), one point's prediction on that plan's cluster (``predict``: ``perf.step`` for its
tokens/s per rank, ``perf.memory`` for its peak per rank) and the ranking (``rank``: the best ``keep`` points of
the whole grid stay, every other one gets the reason it is skipped). Reading the file, the model's shape and which
points the legality table skips are the driver's (``sweep.driver``); this module reads no file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ds_bench.config.layout import Layout
from ds_bench.errors import UserError
from ds_bench.perf.candidate import Candidate
from ds_bench.perf.devices import Cluster
from ds_bench.perf.memory import memory
from ds_bench.perf.shapes import Transformer
from ds_bench.perf.step import step
from ds_bench.record.plan_schema import PlanRecord

GiB = 1024 ** 3
LANGUAGE_MODELS = ("gpt2", "llama", "moe")
"""The workloads ``ds-bench plan`` models."""
PRUNED = "pruned by plan"
"""How every pruned point's reason starts (a later sweep runs such a point once it is kept)."""


@dataclass(frozen=True)
class Prediction:
    key: str
    tokens_per_s_per_rank: float
    memory_bytes: int
    usable_bytes: float
    """The plan cluster's memory per rank less the sweep's ``--headroom``."""

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.usable_bytes


@dataclass(frozen=True)
class Pruning:
    plan_id: str
    source: str
    keep: int
    kept: list[Prediction]
    """Best first."""
    pruned: dict[str, str] = field(default_factory=dict)
    """Point key -> why it is skipped."""


def world_of(record: PlanRecord) -> int:
    return int(record.cluster.get("nodes", 0)) * int(record.cluster.get("per_node", 0))


def pick_plan(records: list[PlanRecord], workload: str, size: str, world: int, source: str) -> PlanRecord:
    """The last (newest) of ``records`` planning ``workload`` at ``size`` on ``world`` ranks; a ``UserError``
    naming ``source`` and what the newest one has otherwise."""
    for r in reversed(records):
        if (r.workload, r.size, world_of(r)) == (workload, size, world):
            return r
    if not records:
        raise UserError(f"--prune-predicted {source}: no plan record in it (ds-bench plan --results {source} "
                        "writes one)")
    r = records[-1]
    c = r.cluster
    differ = [f"{what} {theirs} (the sweep's {ours})" for what, theirs, ours in (
        ("workload", r.workload, workload), ("size", r.size, size)) if theirs != ours]
    if world_of(r) != world:
        differ.append(f"world size {world_of(r)} = {c.get('nodes')} nodes x {c.get('per_node')} (the sweep's {world})")
    raise UserError(f"--prune-predicted {source}: no plan record for {workload} {size} on {world} rank(s); the "
                    f"newest, {r.run_id}, has {'; '.join(differ)}")


def predict(shape: Transformer, point: Layout, seq_len: int, cluster: Cluster, checkpointing: bool,
            headroom_pct: float) -> Prediction | None:
    """``point``'s tokens/s per rank and memory per rank on ``cluster`` for a global batch of its micro-batch x
    accumulation x data-parallel replicas sequences; None when the model cannot say (no whole replica)."""
    candidate = Candidate(point, checkpointing)
    sequences = point.micro_batch * point.grad_accum * candidate.replicas(cluster.world)
    if sequences < 1:
        return None
    try:
        st = step(shape, candidate, seq_len, sequences, cluster)
    except (ValueError, ZeroDivisionError):
        return None
    tokens = sequences * seq_len / cluster.world / st.total_s
    eager = point.attn == "eager" or cluster.device_type == "cpu"
    need = memory(shape, candidate, seq_len, cluster, eager).total
    return Prediction(point.key, tokens, need, cluster.memory_bytes * (1 - headroom_pct / 100))


def rank(predictions: list[Prediction], keep: int, plan_id: str, source: str) -> Pruning:
    """The ``keep`` best of ``predictions`` (those predicted to fit first, then the most tokens/s per rank, then
    the least memory) and each other one's reason."""
    order = sorted(predictions, key=lambda p: (not p.fits, -p.tokens_per_s_per_rank, p.memory_bytes))
    kept, rest = order[:keep], order[keep:]
    best = kept[0].tokens_per_s_per_rank if kept else 0.0
    pruned = {p.key: reason(p, place, len(order), keep, best, plan_id, source)
              for place, p in enumerate(rest, keep + 1)}
    return Pruning(plan_id, source, keep, kept, pruned)


def reason(p: Prediction, place: int, total: int, keep: int, best: float, plan_id: str, source: str) -> str:
    """``pruned by plan <id> (FILE): predicted 123 tokens/s per rank, 7th of 12; kept the best 3 (best 456)``."""
    text = (f"{PRUNED} {plan_id} ({source}): predicted {number(p.tokens_per_s_per_rank)} tokens/s per rank, "
            f"{ordinal(place)} of {total}; kept the best {keep} (best {number(best)})")
    if not p.fits:
        text += f"; predicted {p.memory_bytes / GiB:.2f} GiB per rank > {p.usable_bytes / GiB:.2f} GiB usable"
    return text


def summary(pruning: Pruning) -> list[str]:
    """What ``--dry-run`` says: the plan, each point kept and how many are pruned (their reasons are on their
    own lines)."""
    lines = [f"--prune-predicted: plan {pruning.plan_id} ({pruning.source}) keeps the best {len(pruning.kept)} of "
             f"{len(pruning.kept) + len(pruning.pruned)} predicted point(s), prunes {len(pruning.pruned)}:"]
    lines += [f"  {p.key}  kept: predicted {number(p.tokens_per_s_per_rank)} tokens/s per rank, {ordinal(i)}, "
              f"{p.memory_bytes / GiB:.2f} GiB per rank" for i, p in enumerate(pruning.kept, 1)]
    lines += [f"  {key}  skipped: {why}" for key, why in pruning.pruned.items()]
    return lines


def number(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
