"""``ds-bench plan``'s search: every candidate layout for a model on a cluster, each either ranked by its predicted
tokens/s per rank (``perf.step``) or dropped with why (pure apart from reading the workload's capabilities).

A candidate is DP x TP x PP x SP x EP (degrees whose product of TP, PP and SP divides the world; EP divides the
world and the experts) x engine x ZeRO stage x offload x ALST's tiled MLP and tiled loss x micro-batch x
activation checkpointing (full or selective, and, on GPUs, with its checkpoint offload). It is dropped,
in this order, when:
1. the legality table refuses it (``config.legality``: the rule's sentence), or the workload's model cannot be
   split so (``Workload.check_degrees``; a pipeline deeper than the blocks, TP not dividing the heads, KV heads
   or MLP, SP not dividing the heads or the sequence, EP not dividing the experts);
2. the global batch does not divide into its replicas x micro-batch;
3. its predicted memory per rank (``perf.memory``) exceeds the device's less the headroom, or its offloaded states
   the node's host memory (``overflow``): by how much.
TP is kept inside a node, or an NVLink domain that spans hosts (``Cluster.domain``; its all-reduces are on the
critical path: Narayanan et al. 2021, sec. 3.3).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

from ds_bench.config import legality
from ds_bench.config.degrees import DEGREES
from ds_bench.config.layout import OFFLOADS, Layout
from ds_bench.config.legality_rules import Where
from ds_bench.errors import UserError
from ds_bench.perf import grid
from ds_bench.perf import memory as mem
from ds_bench.perf import step as timing
from ds_bench.perf.candidate import Candidate
from ds_bench.perf.devices import Cluster
from ds_bench.perf.shapes import Transformer

GiB = 1024 ** 3


@dataclass(frozen=True)
class Space:
    """What the search varies (``ds-bench plan``'s axis flags; None: every value that can be)."""

    precision: str = "bf16"
    engines: tuple[str, ...] = ("deepspeed",)
    stages: tuple[int, ...] = (0, 1, 2, 3)
    offloads: tuple[str, ...] = OFFLOADS
    micro_batches: tuple[int, ...] | None = None
    checkpointing: tuple[bool, ...] = (False, True)
    checkpoint_offload: tuple[bool, ...] = (False,)
    """With checkpointing, the checkpointed inputs in host memory too (``--checkpoint-offload``; GPU ranks)."""
    selective: tuple[bool, ...] = (False,)
    """With checkpointing, selective checkpointing too (``--selective-checkpointing``; dense models, no offload of
    the checkpoints beside it)."""
    switches: dict[str, tuple[bool, ...]] | None = None
    """``SWITCHES`` field -> the values to try (ALST's tiled MLP and loss); None: off only."""
    loss: str = "upcast"
    """How the untiled loss is computed (``perf.loss_memory``)."""
    degrees: dict[str, tuple[int, ...]] | None = None
    """Degree field -> the values to try; None: every divisor the model and the world allow."""
    headroom_pct: float = 10.0
    attn: str = ""
    eager: bool = False
    """Whether attention keeps its T x T scores (``--attn eager``). sdpa keeps none on CPU ranks too: torch 2.13
    runs it as ``_scaled_dot_product_flash_attention_for_cpu`` (the op ``workloads.checkpoint_policy`` saves), and
    counting the scores there over-predicted a 12-block GPT-2 at 1,024 tokens by their 1.7 GiB
    (``tools/plan_validation.py --terms``, 2026-11-29)."""
    tp_style: str = "autotp"


@dataclass(frozen=True)
class Planned:
    candidate: Candidate
    step: timing.Step
    memory: mem.Memory
    tokens_per_s_per_rank: float
    mfu: float


@dataclass(frozen=True)
class Dropped:
    label: str
    rule: str
    """What it is grouped under: the legality rule's name, ``model``, ``batch``, ``memory`` or ``host memory``."""
    why: str
    excess_bytes: int = 0


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def degree_values(shape: Transformer, cluster: Cluster, space: Space) -> dict[str, list[int]]:
    """Each registered degree's values: the space's, else by its ``Degree.candidates`` (TP within a node or NVLink
    domain, PP up to the blocks, SP any divisor of the world, EP one that divides the experts; every value beyond 1
    only for a model that has the engine: the caller's legality check says why)."""
    world = cluster.world
    given = space.degrees or {}
    default = {"node": lambda: divisors(cluster.domain),
               "world": lambda: divisors(world),
               "layers": lambda: [d for d in divisors(world) if d <= shape.layers],
               "experts": lambda: [d for d in divisors(world) if shape.experts and shape.experts % d == 0] or [1]}
    return {d.field: sorted(given.get(d.field) or default[d.candidates]()) for d in DEGREES}


def candidates(shape: Transformer, cluster: Cluster, space: Space, sequences: int) -> list[Candidate]:
    """Every combination the space names whose parallel degrees fit the world (no legality yet): the studies' grid
    (``perf.grid.families``, every engine alike) with each family's micro-batches, the accumulation that makes
    ``sequences`` per step, and activation checkpointing off and on (on: with and without the checkpoint offload the
    space names)."""
    world = cluster.world
    out = []
    for family in grid.families(space.stages, space.offloads, (space.precision,), (1,), space.engines,
                                degree_values(shape, cluster, space), attns=(space.attn,), switches=space.switches,
                                every_engine_alike=True):
        split = math.prod(d.size(family) for d in DEGREES if d.splits_replica)
        if world % split or any(world % d.size(family) for d in DEGREES):
            continue
        replicas = world // split
        per_replica = sequences // replicas if sequences % replicas == 0 else 0
        micro = space.micro_batches or [2 ** i for i in range(0, 16) if 2 ** i <= max(1, per_replica)]
        for mbs, ckpt in itertools.product(micro, space.checkpointing):
            ga = per_replica // mbs if per_replica and per_replica % mbs == 0 else 1
            layout = dataclasses.replace(family.with_micro_batch(mbs), grad_accum=ga)
            selective = ckpt and True in space.selective and not shape.experts
            if not (selective and False not in space.selective):  # full checkpointing (or none) too
                offloads = space.checkpoint_offload if ckpt else (False,)
                out += [Candidate(layout, ckpt, offload) for offload in offloads]
            if selective:
                out.append(Candidate(layout, True, selective=True))
    return out


def model_reason(shape: Transformer, layout: Layout, seq_len: int, workload_cls) -> str | None:
    """Why the model cannot be split as ``layout`` says, or None."""
    try:
        workload_cls.check_degrees(layout.degrees())
    except UserError as e:
        return str(e)
    tp, pp, sp, ep = layout.tensor_parallel, layout.pipeline_stages, layout.sequence_parallel, layout.expert_parallel
    if pp > 1 and not workload_cls.has_pipeline():
        return f"--pipeline-stages {pp}: workload {workload_cls.name} has no pipeline model (gpt2 has)"
    if pp > shape.layers:
        return f"--pipeline-stages {pp} is more than the model's {shape.layers} blocks"
    for what, width in (("heads", shape.heads), ("KV heads", shape.kv_heads), ("MLP width", shape.ffn)):
        if tp > 1 and width % tp:
            return f"--tensor-parallel {tp} does not divide the {what} ({width})"
    for what, width in (("heads", shape.heads), ("sequence", seq_len)):
        if sp > 1 and width % sp:
            return f"--sequence-parallel {sp} does not divide the {what} ({width})"
    if sp > 1 and shape.kv_heads % sp and sp % shape.kv_heads:
        return (f"--sequence-parallel {sp}: the {shape.kv_heads} KV heads neither divide by it nor divide it "
                "(ds_bench.engines.degrees.sequence_parallel)")
    if ep > 1 and shape.experts % ep:
        return f"--expert-parallel {ep} does not divide the {shape.experts} experts"
    return None


def screen(shape: Transformer, cluster: Cluster, space: Space, seq_len: int, sequences: int, workload_cls,
           run_options: frozenset[str] = frozenset()) -> tuple[list[Candidate], list[Dropped]]:
    """The candidates the legality table, the model and the batch allow (steps 1-2 of the module docstring), and
    the ones dropped with why; ``run_options``: what every run of the plan sets beyond its layout
    (``config.legality.run_options`` of the ``--`` tail), which the rules refuse too."""
    world, kept, dropped = cluster.world, [], []
    where = Where(world, cluster.device_type, run_options,
                  frozenset({"expert_parallel"}) if shape.experts else frozenset())  # a moe model's layer at EP = 1
    for c in candidates(shape, cluster, space, sequences):
        label = c.label(world)
        layout = dataclasses.replace(c.layout, seq_len=seq_len)
        at = dataclasses.replace(where, run_options=where.run_options | c.run_options())
        rule = legality.first_broken(layout, at)
        if rule is None and c.layout.engine == "ddp" and c.layout.stage:
            continue  # DDP replicates: one candidate (z0) per precision, as the sweep takes it
        if rule is not None:
            dropped.append(Dropped(label, rule.name, rule.says(layout, at)))
            continue
        why = model_reason(shape, c.layout, seq_len, workload_cls)
        if why:
            dropped.append(Dropped(label, "model", why))
            continue
        if timing.micro_steps(c, sequences, world) is None:
            dropped.append(Dropped(label, "batch", f"{sequences} sequences do not divide into "
                                   f"{c.replicas(world)} replicas x micro-batch {c.layout.micro_batch}"))
            continue
        kept.append(c)
    return kept, dropped


def usable_bytes(cluster: Cluster, space: Space) -> float:
    """A device's memory less the space's headroom: what a candidate's prediction must stay within."""
    return cluster.memory_bytes * (1 - space.headroom_pct / 100)


def overflow(need: mem.Memory, cluster: Cluster, space: Space) -> tuple[str, str, int] | None:
    """(rule, why, bytes over) when ``need`` does not fit: ``memory``, the device's usable memory; ``host memory``,
    the node's, which its ranks' offloaded states share (``Cluster.host_memory_bytes`` less the same headroom;
    unknown: unchecked)."""
    capacity = usable_bytes(cluster, space)
    if need.total > capacity:
        over = need.total - capacity
        return ("memory", f"needs {need.total / GiB:.1f} GiB per rank, {over / GiB:.1f} GiB over the "
                f"{capacity / GiB:.1f} GiB usable", int(over))
    host = cluster.host_memory_bytes * (1 - space.headroom_pct / 100)
    if cluster.host_memory_bytes and need.host * cluster.per_node > host:
        over = need.host * cluster.per_node - host
        return ("host memory", f"offloads {need.host * cluster.per_node / GiB:,.0f} GiB to each node's host, "
                f"{over / GiB:,.0f} GiB over its {host / GiB:,.0f} GiB usable", int(over))
    return None


def predicted(shape: Transformer, c: Candidate, cluster: Cluster, space: Space, seq_len: int,
              sequences: int) -> Planned:
    """One candidate's memory and step (``perf.memory``, ``perf.step``), its tokens/s per rank and MFU."""
    need = mem.memory(shape, c, seq_len, cluster, space.eager or c.layout.attn == "eager", space.loss)
    st = timing.step(shape, c, seq_len, sequences, cluster, space.tp_style)
    tokens = sequences * seq_len / cluster.world / st.total_s
    mfu = tokens * shape.flops_per_token(seq_len) / ((cluster.mfu_peak_tflops or cluster.peak_tflops) * 1e12)
    return Planned(c, st, need, tokens, mfu)


def search(shape: Transformer, cluster: Cluster, space: Space, seq_len: int, sequences: int,
           workload_cls, run_options: frozenset[str] = frozenset()) -> tuple[list[Planned], list[Dropped]]:
    """Every candidate ranked (best first) or dropped (module docstring; ``screen``, then the memory)."""
    kept, dropped = screen(shape, cluster, space, seq_len, sequences, workload_cls, run_options)
    ranked = []
    for c in kept:
        need = mem.memory(shape, c, seq_len, cluster, space.eager or c.layout.attn == "eager", space.loss)
        over = overflow(need, cluster, space)
        if over:
            dropped.append(Dropped(c.label(cluster.world), *over))
            continue
        ranked.append(predicted(shape, c, cluster, space, seq_len, sequences))
    ranked.sort(key=lambda p: (-round(p.tokens_per_s_per_rank, 6), p.candidate.extras(), p.memory.total))
    return ranked, dropped
