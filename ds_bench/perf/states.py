"""The model states one rank holds under a layout, by ZeRO stage, precision, offload and parallel degree
(parameters, gradients, optimizer states; pure): what every memory prediction adds its activations to (the
sweep's and capacity's, ``perf.peak_memory``; the sequence search's, ``perf.seq_memory``; ``plan``'s at any
scale, ``perf.memory``).

Per rank (``model_states_bytes``), Ψ = parameters, N = world size, L = largest layer's parameters
(``ModelShape``); with T-way tensor parallelism Ψ/T, L/T and N/T (``tensor_parallel_share``), the activations
then calibrated on a point of the same T:

- bf16/fp16, ZeRO 2 and 3: DeepSpeed's own estimators,
  ``stage_1_and_2.estimate_zero2_model_states_mem_needs`` and
  ``stage3.estimate_zero3_model_states_mem_needs`` (buffer factor 1.5, their default; zero_init
  off: ds_bench builds the whole model on every rank). They return host memory per node and
  device memory per rank.
- bf16/fp16, ZeRO 0 and 1: the ZeRO paper (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations
  Toward Training Trillion Parameter Models", sec. 3.1 and 5): mixed-precision Adam holds 2Ψ
  params + 2Ψ grads + KΨ optimizer states (K = 12: fp32 master, momentum, variance); P_os
  partitions the KΨ over N ranks: ZeRO-0 16Ψ, ZeRO-1 4Ψ + 12Ψ/N (offload moves the 12Ψ/N to the
  host). Measured against DeepSpeed 0.19.8 (live tensor bytes, 2 CPU ranks): 16Ψ and 9Ψ
  (paper: 10Ψ; DeepSpeed keeps only a gradient partition).
- fp32, every stage: the paper's fp32 Adam is 4Ψ params + 4Ψ grads + 8Ψ states (ZeRO-0 16Ψ,
  measured exactly). DeepSpeed 0.19.8 keeps more than the paper's partitioning, measured (live
  tensor bytes after a step, 2 and 4 CPU ranks, 4.2M-parameter model) and adopted because the
  paper's figure is below it: ZeRO 1/2 clone an fp32 master partition even when the params are
  fp32 (stage_1_and_2.py, ``weights_partition = ...clone()``) and keep an fp32 gradient
  partition: 4Ψ + 16Ψ/N (paper: 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N; measured 12Ψ at N=2, 8Ψ at N=4);
  with optimizer offload add a bit16 partition buffer and two largest-parameter gradient
  buffers: 4Ψ + 20Ψ/N + 8L (measured 16Ψ, 11Ψ); ZeRO-3: 20Ψ/N + 4L (paper 16Ψ/N; measured
  11Ψ, 6Ψ), 4L being one gathered layer as in DeepSpeed's ZeRO-3 estimator.
- mixture of experts (``ModelShape.expert_params`` Ψ_e of the Ψ; ``expert_parallel_groups``): ZeRO partitions
  DeepSpeed's expert parameter groups apart (``split_params_into_different_moe_groups_for_optimizer``; deepspeed
  0.19.8 ``stage_1_and_2.py`` partitions each over its ``expert_dp_process_group``), so a rank's states are two
  groups' by the formulas above: its Ψ_e/EP experts over their W/EP expert-data-parallel ranks, and the
  Ψ - Ψ_e rest (attention, router, norms, embedding, head) over all W ranks. E.g. mixed-precision ZeRO-1:
  4Ψ_e/EP + 12Ψ_e/W for the experts (the optimizer states stay 1/W of them at every EP; EP shards the 4 B
  of weights and gradients per parameter) + 4(Ψ - Ψ_e) + 12(Ψ - Ψ_e)/W. At EP = 1 it is the dense formula
  over Ψ. The largest layer L goes with the rest (one gathered-layer buffer, the embedding in a MoE model).
On CPU ranks device and host memory are the same RSS, so a rank's share is device part + host
part / ranks per node; on a GPU only the device part counts (``peak_mem_bytes`` is
``max_memory_allocated``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ds_bench.config.layout import Layout

ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes per element in each compute precision."""
BUFFER_FACTOR = 1.5
"""DeepSpeed's estimators' ``additional_buffer_factor`` default."""


@dataclass(frozen=True)
class ModelShape:
    params: int
    largest_layer_params: int
    expert_params: int = 0
    """Of ``params``, the experts' (``moe_shapes.expert_param_count``): what ``--expert-parallel`` shards; 0: dense."""
    muon_params: int = 0
    """Of ``params``, those DeepSpeed's Muon steps (``deepspeed.set_optimizer_flags``: every matrix outside the
    embeddings and the LM head; ``perf.shapes.Transformer.muon_params``, or a run's record); the rest take Muon's
    AdamW half."""


MODELLED = ("tensor_parallel", "sequence_parallel", "expert_parallel")
"""The parallel degrees the memory model knows the model states of: AutoTP's split (``tensor_parallel_share``);
Ulysses splits none: ZeRO partitions over every rank of the sequence and data-parallel groups
(deepspeed 0.19.8 ``runtime/engine.py``: ``seq_data_parallel_group`` is the optimizer's ``dp_process_group`` and
ZeRO-3's partition group), so a rank's states are data parallelism's over the world size; expert parallelism
shards the experts (``expert_parallel_groups``). A layout with
another degree (a pipeline stage holds its own layers) is not predicted."""


def models(layout: Layout) -> bool:
    """Whether this model predicts the layout: DeepSpeed's engine (DDP/FSDP memory follows other rules) and
    no parallel degree beyond ``MODELLED``."""
    return layout.engine == "deepspeed" and all(name in MODELLED for name in layout.degrees())


def model_states_bytes(shape: ModelShape, point: Layout, world_size: int, ranks_per_node: int,
                       device_type: str) -> int:
    """Parameters, gradients and optimizer states one rank holds, in bytes."""
    device, host_per_rank = _states(shape, point, world_size, ranks_per_node)
    return int(device + host_per_rank) if device_type == "cpu" else int(device)


def offloaded_bytes_per_param(point: Layout) -> int:
    """Bytes per parameter of a rank's partition that offload keeps in host memory once training runs: the fp32
    master parameters, their gradients and Adam's two moments (ZeRO-Offload, Ren et al. 2021, sec. 4.1: 16), with
    ``offload=all`` the parameters' 16-bit copy as well (ZeRO-Infinity, Rajbhandari et al. 2021: +2; none in fp32,
    whose master copy is the parameter). DeepSpeed's estimators (above) give more, the peak of building the model
    whole on every rank's host before it is partitioned, which ``zero_init`` avoids."""
    low_precision_copy = point.offload == "all" and point.precision != "fp32"
    return 16 + (ELEMENT_BYTES[point.precision] if low_precision_copy else 0)


def offloaded_bytes(shape: ModelShape, point: Layout, world_size: int, ranks_per_node: int) -> int:
    """What offload keeps of one rank's model states in host memory once training runs
    (``offloaded_bytes_per_param`` per parameter of each group ZeRO partitions apart, its TP share over its
    ranks); 0 without offload."""
    if point.offload == "none" or point.stage == 0:
        return 0
    total = 0.0
    for group, n, per_node in expert_parallel_groups(shape, point.expert_parallel, world_size, ranks_per_node):
        share, ranks, _ = tensor_parallel_share(group, point.tensor_parallel, n, per_node)
        total += offloaded_bytes_per_param(point) * share.params / ranks
    return int(total)


def _states(shape: ModelShape, point: Layout, n: int, ranks_per_node: int) -> tuple[float, float]:
    """(device bytes per rank, host bytes per rank): the sum over the groups ZeRO partitions apart."""
    parts = [_group_states(*group, point) for group in expert_parallel_groups(shape, point.expert_parallel, n,
                                                                              ranks_per_node)]
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def expert_parallel_groups(shape: ModelShape, ep: int, n: int,
                           ranks_per_node: int) -> list[tuple[ModelShape, int, int]]:
    """(what one rank holds of a parameter group, the ranks ZeRO partitions it over, of them per node) for each
    group partitioned apart (pure; module docstring): at EP > 1 with experts, this rank's Ψ_e/EP experts over the
    W/EP ranks holding the same ones, and the rest over all W; else the whole model over all W."""
    if ep <= 1 or not shape.expert_params:
        return [(shape, n, ranks_per_node)]
    experts = ModelShape(math.ceil(shape.expert_params / ep), 0)
    rest = ModelShape(shape.params - shape.expert_params, shape.largest_layer_params)
    return [(experts, max(1, n // ep), max(1, ranks_per_node // ep)), (rest, n, ranks_per_node)]


def _group_states(shape: ModelShape, n: int, ranks_per_node: int, point: Layout) -> tuple[float, float]:
    shape, n, ranks_per_node = tensor_parallel_share(shape, point.tensor_parallel, n, ranks_per_node)
    if point.precision != "fp32" and point.stage in (2, 3):
        cpu_per_node, device = _deepspeed_estimate(shape, point, n, ranks_per_node)
        device, host = device, cpu_per_node / ranks_per_node
    elif point.precision == "fp32":
        device, host = _fp32_states(shape.params, shape.largest_layer_params, point, n)
    else:
        device, host = _mixed_states(shape.params, point, n)
    change = optimizer_state_change(shape, point) / (n if point.stage >= 1 else 1)  # ZeRO partitions them
    return (device, host + change) if point.offload != "none" and point.stage >= 1 else (device + change, host)


def master_bytes_per_param(point: Layout) -> int:
    """The optimizer's copy of a parameter it updates: fp32 (4 B; ZeRO 1-3 clone one even in an fp32 run, the module
    docstring; at ZeRO-0 in fp32 the parameter is it: 0), or bf16 with ``--master-states bf16`` or ``bf16-weights``
    (``bf16_master_weights_and_grads``: 2 B)."""
    if point.master_states in ("bf16", "bf16-weights") and point.precision == "bf16":
        return 2
    return 0 if point.precision == "fp32" and point.stage == 0 else 4


def moment_bytes_per_param(point: Layout, muon_share: float = 0.0) -> float:
    """The optimizer's state per parameter: Adam's two moments (Kingma and Ba 2015), 4 B each, 2 B with
    ``--master-states bf16`` (``bf16_optimizer_states``); ``--optimizer muon`` keeps one momentum buffer for the
    ``muon_share`` of the parameters Muon steps (Jordan et al. 2024) and Adam's two for the rest. Measured
    (``ds_bench.measure.optimizer_state``, docs/options.md): exact at ZeRO 1 and 3."""
    each = 2 if point.master_states == "bf16" and point.precision == "bf16" else 4
    buffers = (1 if point.optimizer == "muon" else 2) * muon_share + 2 * (1 - muon_share)
    return each * buffers


def optimizer_bytes_per_param(point: Layout, muon_share: float = 0.0) -> float:
    """K of the ZeRO paper (Rajbhandari et al. 2020, sec. 3.1: 12 in mixed precision): the master copy and the
    moments, what ZeRO 1-3 partition over the ranks."""
    return master_bytes_per_param(point) + moment_bytes_per_param(point, muon_share)


def optimizer_state_change(shape: ModelShape, point: Layout) -> float:
    """Bytes a rank's optimizer holds beyond (or short of) the AdamW states the formulas above count, for the whole
    ``shape`` before ZeRO partitions it: (K(point) - K(AdamW, same precision)) x Ψ."""
    share = shape.muon_params / shape.params if shape.params else 0.0
    plain = Layout(point.stage, point.offload, point.precision, point.micro_batch)
    return (optimizer_bytes_per_param(point, share) - optimizer_bytes_per_param(plain)) * shape.params


def tensor_parallel_share(shape: ModelShape, t: int, n: int, ranks_per_node: int) -> tuple[ModelShape, int, int]:
    """What ZeRO partitions on a rank of a T-way AutoTP group (pure): its 1/T share of the parameters
    (and of the largest layer), over the N/T data-parallel ranks (and per node). AutoTP shards every
    block's projections and the LM head; the norms it keeps whole are ~0.01% of a Llama (measured, tiny
    Llama at T = 2: rank 0 holds 1,645,440 of 3,290,496, Ψ/2 + 192)."""
    if t <= 1:
        return shape, n, ranks_per_node
    share = ModelShape(math.ceil(shape.params / t), math.ceil(shape.largest_layer_params / t))
    return share, max(1, n // t), max(1, ranks_per_node // t)


def _deepspeed_estimate(shape: ModelShape, point: Layout, n: int, ranks_per_node: int) -> tuple[int, int]:
    nodes = max(1, n // ranks_per_node)
    if point.stage == 2:
        from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
        return estimate_zero2_model_states_mem_needs(
            shape.params, num_gpus_per_node=ranks_per_node, num_nodes=nodes,
            cpu_offload=point.offload != "none", additional_buffer_factor=BUFFER_FACTOR)
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    cpu, device, _largest_layer = estimate_zero3_model_states_mem_needs(
        shape.params, shape.largest_layer_params, num_gpus_per_node=ranks_per_node, num_nodes=nodes,
        cpu_offload=point.offload != "none", cpu_offload_params=point.offload == "all",
        zero_init=False, additional_buffer_factor=BUFFER_FACTOR)
    return cpu, device


def _mixed_states(psi: int, point: Layout, n: int) -> tuple[float, float]:
    """ZeRO paper, 2Ψ + 2Ψ + 12Ψ: stage 0 whole, stage 1 optimizer states partitioned."""
    if point.stage == 0:
        return 16 * psi, 0
    optimizer = 12 * psi / n
    return (4 * psi, optimizer) if point.offload != "none" else (4 * psi + optimizer, 0)


def _fp32_states(psi: int, layer: int, point: Layout, n: int) -> tuple[float, float]:
    """fp32 Adam as DeepSpeed 0.19.8 keeps it (module docstring): (device, host) per rank."""
    if point.stage == 0:
        return 16 * psi, 0
    if point.stage in (1, 2):
        if point.offload == "none":
            return 4 * psi + 16 * psi / n, 0
        return 4 * psi + 4 * layer, 20 * psi / n + 4 * layer
    if point.offload == "none":
        return 20 * psi / n + 4 * layer, 0
    if point.offload == "optimizer":
        return 4 * psi / n + 4 * layer, 16 * psi / n
    return 4 * layer, 20 * psi / n
