"""One optimizer step's time on the busiest rank of a candidate layout, broken down (pure; docs/plan.md).

    step = compute + exposed communication + pipeline bubble + optimizer

- **compute** = tokens per step x FLOPs per token (``perf.shapes``; with activation checkpointing the recomputed
  forward too, selective checkpointing's recomputed matmuls only, with ``--tiled-mlp`` the MLP's forward again) / ranks / (peak x achieved fraction). A third of the model FLOPs is the forward, the rest the
  backward (recomputation counts with the backward).
- **communication**, each collective's bus bytes per step over the busbw of the link its group spans
  (``perf.devices.Cluster.busbw``; bus bytes as nccl-tests defines them, ``perf.bus_bytes``):
  - data parallel (ZeRO's volumes, ``perf.bus_bytes.bus_bytes_per_step``): the dense parameters' 1/(T P)
    over the world / (T P) ranks ZeRO partitions them over (sequence ranks included); a MoE's experts' 1/(EP P)
    over their world / (EP P) holders. DDP moves ZeRO-0's bytes; FSDP ZeRO-3's (FSDP at "stage 2",
    ``reshard_after_forward=False``, gathers once per micro-step instead of twice);
  - tensor parallel: per micro-step ``TP_ALL_REDUCES`` all-reduces per block (+``TP_RECOMPUTED`` with
    checkpointing, full or selective) and 2 for
    the embedding and head, each micro-batch x T x h elements, 2(t-1)/t of them on the bus;
  - Ulysses: per micro-step and block 8 all-to-alls (+4 with checkpointing) of the rank's q, k, v and output
    slices (``CausalLMWorkload.sequence_parallel_all_to_all_elements``' count), (S-1)/S on the bus;
  - experts: per MoE block 4 all-to-alls (+2 with checkpointing) of the rank's k x tokens x h dispatch buffer
    (capacity factor 1), (EP-1)/EP on the bus;
  - pipeline: each micro-batch's activation forward and its gradient back, micro-batch x T x h elements each,
    at one rank's share of the link; a tied embedding's gradient all-reduced between the first and last stage
    (DeepSpeed's ``_exec_reduce_tied_grads``, Megatron's embedding all-reduce) once per step.
  Each message is timed at the busbw measured at its size where a comm record gives the curve (``--calibrate``:
  many small all-reduces pay their latency): TP's and the pipeline's a micro-batch's activations, Ulysses' a
  quarter of a block's q, k, v and output slices, the experts' a block's dispatch buffer, data parallelism's
  its buckets (``dp_messages``); the datasheet's figures are large messages'.
  Groups are placed TP innermost, then SP (or EP), then DP, the pipeline outermost (Megatron-LM's order): a
  group spans nodes when its ranks' stride x size exceeds a node.
- **overlap** (the assumption, ``OVERLAPS``): on GPUs DDP's bucketed all-reduce and ZeRO-2's reduce-scatter
  (``overlap_comm``) hide behind the backward, ZeRO-3's and FSDP's gathers (prefetched) behind forward and
  backward, up to the compute they overlap; ZeRO-0/1's reductions (at the accumulation boundary), every
  all-gather of updated parameters after the step, tensor/sequence/expert collectives (on the critical path)
  and anything under a pipeline (reduced after the flush) are exposed. On CPU ranks nothing overlaps: gloo's
  threads and the compute share the same cores.
- **pipeline** (1F1B): the step runs at its busiest stage, the last (ceil(L/P) blocks and the LM head): m micro-batches
  of it, plus the **bubble**, one micro-batch through every other stage while the pipeline fills and drains:
  compute = m x share x T and bubble = (1 - share) x T, T one micro-batch through the whole model; balanced stages
  (share 1/P) give Narayanan et al.'s bubble, (P-1)/m of the compute, a fraction (P-1)/(m+P-1) of the step.
- **optimizer**: Adam reads and writes ``OPTIMIZER_BYTES`` per parameter the rank updates at its memory
  bandwidth (``--optimizer muon``: and Muon's Newton-Schulz FLOPs, ``Transformer.newton_schulz_flops``, at the achieved
  rate); offloaded, DeepSpeed's CPU Adam at the host's and each step's gradients down and parameters up
  over PCIe (``host_GBps``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ds_bench.perf.bus_bytes import (
    bus_bytes_per_step,
    expert_parallel_bus_bytes,
    sequence_parallel_bus_bytes,
    tensor_parallel_bus_bytes,
)
from ds_bench.perf.candidate import Candidate
from ds_bench.perf.devices import Cluster
from ds_bench.perf.shapes import Transformer
from ds_bench.perf.states import ELEMENT_BYTES

TP_ALL_REDUCES = {"autotp": 7, "megatron": 4}
"""All-reduces per block and micro-step: AutoTP's 2 forward + 5 backward (measured, ``ds_bench.workloads.llama``);
Megatron-LM's 2 + 2 (Shoeybi et al. 2019, sec. 3)."""
TP_RECOMPUTED = {"autotp": 1, "megatron": 2}
"""The forward's all-reduces a block's recompute repeats: Megatron-LM's both; torch's non-reentrant checkpoint
(ds-bench's, full or selective) stops once backward's tensors are back, before the MLP's (tests/test_llama.py)."""
OPTIMIZER_BYTES = {"mixed": 30, "fp32": 28}
"""Adam per parameter: reads fp32 params, gradients, m, v (16 B), writes params, m, v (12 B) and, in mixed
precision, the 2-byte copy the model computes with."""
HOST_ADAM_GBps = 10.0
"""DeepSpeed CPU Adam's memory rate per rank on a GPU node (a node's ~100-200 GB/s shared by its ranks)."""
OVERLAPS = {("deepspeed", 2): {"reduce_scatter": "backward"},
            ("deepspeed", 3): {"reduce_scatter": "backward", "all_gather": "compute"},
            ("ddp", 0): {"all_reduce": "backward"},
            ("fsdp", 2): {"reduce_scatter": "backward", "all_gather": "compute"},
            ("fsdp", 3): {"reduce_scatter": "backward", "all_gather": "compute"}}
"""(engine, stage) -> data-parallel collective -> the compute it hides behind (module docstring)."""


@dataclass(frozen=True)
class Step:
    compute_s: float
    forward_s: float
    comm_s: dict[str, float]
    """Collective -> seconds on the bus per step, before overlap."""
    exposed_s: dict[str, float]
    """Collective -> seconds the step waits for it."""
    bubble_s: float
    optimizer_s: float
    micro_steps: int
    busbw_GBps: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.exposed_s.values()) + self.bubble_s + self.optimizer_s


def micro_steps(candidate: Candidate, sequences: int, world: int) -> int | None:
    """Micro-batches per step of each replica, None when the global batch does not divide evenly."""
    per_step = candidate.replicas(world) * candidate.layout.micro_batch
    return sequences // per_step if per_step and sequences % per_step == 0 else None


def group(size: int, stride: int, cluster: Cluster) -> tuple[int, bool]:
    """(the group's ranks on each node, whether it leaves the fast fabric) for ranks r, r + stride, ... in rank
    order: a group inside one NVLink domain (``Cluster.domain``: a node, or GB200 NVL72's 72 GPUs over 18 hosts)
    runs at its busbw even across hosts; beyond it, at the network's share of its ranks on each node."""
    g = cluster.per_node
    spans = size > 1 and cluster.world > cluster.domain and stride * size > cluster.domain
    return (1 if stride >= g else min(size, g // stride)), spans


def step(shape: Transformer, candidate: Candidate, seq_len: int, sequences: int, cluster: Cluster,
         tp_style: str = "autotp") -> Step:
    """The step of ``candidate`` for a global batch of ``sequences`` of ``seq_len`` tokens (module docstring)."""
    layout, world = candidate.layout, cluster.world
    m = micro_steps(candidate, sequences, world)
    if m is None:
        raise ValueError(f"{sequences} sequences do not divide over {candidate.label(world)}")
    hardware = shape.flops_per_token(seq_len, candidate.checkpointing, layout.tiled_mlp, candidate.selective)
    flops = sequences * seq_len * hardware / world
    balanced = flops / (cluster.peak_tflops * 1e12 * cluster.achieved)
    p = layout.pipeline_stages
    share = busiest_stage_share(shape, p, seq_len, candidate.checkpointing)
    compute = balanced * p * share
    bubble = (1 - share) * balanced * p / m if p > 1 else 0.0
    forward = compute * shape.flops_per_token(seq_len) / 3 / hardware
    moved = collectives(shape, candidate, seq_len, m, cluster, tp_style)
    comm = {name: seconds for name, (_, seconds) in moved.items()}
    exposed = exposed_times(comm, candidate, cluster, compute, forward)
    return Step(compute, forward, comm, exposed, bubble, optimizer_s(shape, candidate, cluster), m,
                {name: nbytes / seconds / 1e9 for name, (nbytes, seconds) in moved.items() if seconds})


def busiest_stage_share(shape: Transformer, stages: int, seq_len: int, recompute: bool) -> float:
    """The busiest pipeline stage's share of a micro-batch's FLOPs: the last, with its ceil(L/P) blocks and the LM
    head (6 V h per token; the embedding lookup costs none); 1 without a pipeline."""
    if stages <= 1:
        return 1.0
    total = shape.flops_per_token(seq_len, recompute)
    head = 6.0 * shape.vocab * shape.hidden
    return min(1.0, (-(-shape.layers // stages) * (total - head) / shape.layers + head) / total)


def collectives(shape: Transformer, candidate: Candidate, seq_len: int, m: int,
                cluster: Cluster, tp_style: str = "autotp") -> dict[str, tuple[float, float]]:
    """Collective -> (bus bytes per step on the rank's link, seconds they take at the busbw of their groups)."""
    layout, world = candidate.layout, cluster.world
    e = ELEMENT_BYTES[layout.precision]
    t, p, s, ep = layout.tensor_parallel, layout.pipeline_stages, layout.sequence_parallel, layout.expert_parallel
    stage = 0 if layout.engine == "ddp" else layout.stage
    out: dict[str, tuple[float, float]] = {}

    def add(name: str, nbytes: float, collective: str, size: int, stride: int, message: float) -> None:
        """Bytes and seconds of ``name``; a name two groups share (the dense parameters' and the experts' gradients)
        adds each group's seconds at its own busbw."""
        if nbytes <= 0:
            return
        per_node, spans = group(size, stride, cluster)
        bw = cluster.busbw(collective, per_node, spans, message)
        seconds = nbytes / (bw * 1e9) if bw > 0 else float("inf")
        before = out.get(name, (0.0, 0.0))
        out[name] = (before[0] + nbytes, before[1] + seconds)

    dense = (shape.params - shape.expert_params) / (t * p)
    dp_ranks = world // (t * p)
    fsdp = layout.engine == "fsdp"
    scatter = not (layout.optimizer == "muon" and stage == 3)  # --optimizer muon turns it off there
    volumes = bus_bytes_per_step(3 if fsdp else stage, int(dense), e, e, dp_ranks, m, scatter) if dp_ranks > 1 else {}
    if fsdp and stage == 2 and volumes:  # parameters kept whole from forward to backward: one gather per micro-step
        volumes["all_gather"] /= 2
    messages = dp_messages(shape, layout, e)
    for collective, nbytes in volumes.items():
        add(collective, nbytes, collective, dp_ranks, t, messages[collective])
    if shape.expert_params and world // (ep * p) > 1:
        holders = world // (ep * p)
        for collective, nbytes in bus_bytes_per_step(stage, shape.expert_params // (ep * p), e, e, holders, m).items():
            add(collective, nbytes, collective, holders, ep, messages[collective])
    tokens = layout.micro_batch * seq_len
    ckpt = candidate.checkpointing  # selective too: it repeats the same collectives (measured, TP_RECOMPUTED)
    stage_layers = -(-shape.layers // p)
    if t > 1:
        count = (TP_ALL_REDUCES[tp_style] + (TP_RECOMPUTED[tp_style] if ckpt else 0)) * stage_layers + 2
        message = tokens * shape.hidden * e
        moved = tensor_parallel_bus_bytes(t, count * tokens * shape.hidden, e, m)
        add("tp_all_reduce", moved, "all_reduce", t, 1, message)
    if s > 1:
        per_pass = (2 * shape.heads + 2 * max(shape.kv_heads, s)) * shape.head_dim * tokens / s
        passes = (8 + (4 if ckpt else 0)) // 4 * stage_layers
        moved = sequence_parallel_bus_bytes(s, passes * per_pass, e, m)
        add("sp_all_to_all", moved, "all_to_all", s, t, per_pass * e / 4)
    if ep > 1 and shape.experts:
        count = (4 + (2 if ckpt else 0)) * stage_layers
        message = shape.top_k * tokens * shape.hidden * e
        add("ep_all_to_all", expert_parallel_bus_bytes(ep, count * message * m), "all_to_all", ep, 1, message)
    if p > 1:
        message = tokens * shape.hidden * e / t
        add("pp_send_recv", 2 * m * message, "send_recv", 2, world // p, message)
        if shape.tied:  # the first and the last stage: (P-1) x world / P ranks apart
            tied = shape.vocab * shape.hidden / t * e
            add("pp_tied_all_reduce", tied, "all_reduce", 2, (p - 1) * world // p, tied)
    return out


BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``allreduce_bucket_size`` / ``allgather_bucket_size`` (elements)."""


def dp_messages(shape: Transformer, layout, element_bytes: int) -> dict[str, float]:
    """The message each data-parallel collective sends: ZeRO's reduce-scatter a ``reduce_bucket_size`` of h^2
    elements (``"auto"`` in ds_bench's configs, Hugging Face's rule), ZeRO-3's and FSDP's gathers one block, the
    rest (ZeRO-0's all-reduce, ZeRO-1/2's gather of updated parameters) DeepSpeed's 5e8-element buckets."""
    dense = (shape.params - shape.expert_params) / (layout.tensor_parallel * layout.pipeline_stages)
    block = shape.block_params() / layout.tensor_parallel * element_bytes
    whole = min(dense, BUCKET_ELEMENTS) * element_bytes
    sharded = layout.engine == "fsdp" or layout.stage == 3
    bucket = shape.hidden ** 2 * element_bytes
    return {"all_reduce": whole, "reduce_scatter": block if layout.engine == "fsdp" else bucket,
            "all_gather": block if sharded else whole}


def exposed_times(comm: dict[str, float], candidate: Candidate, cluster: Cluster, compute: float,
                  forward: float) -> dict[str, float]:
    """Collective -> the seconds the step waits for it, under ``OVERLAPS`` (module docstring)."""
    layout = candidate.layout
    stage = 0 if layout.engine == "ddp" else layout.stage
    overlapped = cluster.device_type != "cpu" and layout.pipeline_stages == 1
    hidden = OVERLAPS.get((layout.engine, stage), {}) if overlapped else {}
    backward = compute - forward
    in_backward = sum(v for k, v in comm.items() if hidden.get(k) == "backward")
    in_compute = sum(v for k, v in comm.items() if hidden.get(k) == "compute")
    left_backward = max(0.0, in_backward - backward)
    left_compute = max(0.0, in_compute - (compute - min(in_backward, backward)))
    out = {k: v for k, v in comm.items() if k not in hidden}
    for k in hidden:
        if k in comm:
            total = in_backward if hidden[k] == "backward" else in_compute
            share = comm[k] / total if total else 0.0
            out[k] = share * (left_backward if hidden[k] == "backward" else left_compute)
    return out


def optimizer_s(shape: Transformer, candidate: Candidate, cluster: Cluster) -> float:
    """Adam over the parameters this rank updates (module docstring)."""
    layout, world = candidate.layout, cluster.world
    t, p = layout.tensor_parallel, layout.pipeline_stages
    stage = 0 if layout.engine == "ddp" else layout.stage
    dense = (shape.params - shape.expert_params) / (t * p)
    experts = shape.expert_params / (layout.expert_parallel * p)
    if stage >= 1:
        dense /= world // (t * p)
        experts /= max(1, world // (layout.expert_parallel * p))
    local = dense + experts
    per_param = OPTIMIZER_BYTES["fp32" if layout.precision == "fp32" else "mixed"]
    orthogonalise = shape.newton_schulz_flops() / (t * p) / (world // (t * p) if stage >= 1 else 1) \
        if layout.optimizer == "muon" else 0.0
    if layout.offload == "none" or cluster.device_type == "cpu":
        return local * per_param / (cluster.hbm_GBps * 1e9) + orthogonalise / (
            cluster.peak_tflops * 1e12 * cluster.achieved)
    e = ELEMENT_BYTES[layout.precision]
    return local * per_param / (HOST_ADAM_GBps * 1e9) + local * 2 * e / (cluster.host_GBps * 1e9)
