"""A sweep point's peak memory per rank, predicted before it is launched, and whether it fits.

prediction = baseline + model states(point) + activations(point) [+ fixed, from two runs]

- **baseline**: what a rank held before the model was built (record ``baseline_mem_bytes``:
  runtime, libraries, process group; ``ds_bench.run.main`` preloads the libraries every stage imports).
- **model states** (``model_states_bytes``), per rank, Ψ = parameters, N = world size,
  L = largest layer's parameters (``ModelShape``); with T-way tensor parallelism Ψ/T, L/T and N/T
  (``tensor_parallel_share``), the activations then calibrated on a point of the same T:
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
- **activations**: scaled from one measured small-micro-batch run (``calibrate``):
  per sample = (peak - baseline - model states of that run) / micro-batch, floored at 0, times
  micro-batch and the ratio of element sizes (fp32 4, bf16/fp16 2). This is linear in micro-batch,
  which holds for activations, their gradients and logits (measured on 2 CPU ranks, fp32: mnist
  0.8-1.2 MiB/sample between micro-batches 8, 32 and 128, GPT-2 tiny 81 MiB/sample), and is wrong
  where memory does not scale with it: a fixed cost the first step pays (kernels' code pages,
  allocator arenas, buffers) is read as per-sample memory and over-predicts larger micro-batches
  (mnist from 8 to 128: 1.8x the measured peak; GPT-2 tiny from 2 to 8: 1.25x); the peak of a big
  model may be the initialization transient (flattening copies), not the step; activation
  checkpointing and attention kernels whose memory is not linear in batch are not modelled.
  Given a second run of the same family at another micro-batch (``second=``), the slope is the
  per-sample figure and the intercept the fixed cost (the same points: 0.91-1.0x). The element
  size ratio is wrong for memory kept in fp32 whatever the precision: Hugging Face's causal-LM
  loss upcasts the logits (transformers/loss/loss_utils.py), so GPT-2 tiny in bf16 measured 0.93x
  its fp32 activations, not 0.5x, and an fp32 calibration predicted 0.77-0.86x of its bf16 peaks:
  calibrate on a point of the same precision where the sweep has one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import psutil

from ds_bench.config.layout import Layout
from ds_bench.record.schema import RunRecord

ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
BUFFER_FACTOR = 1.5
"""DeepSpeed's estimators' ``additional_buffer_factor`` default."""


@dataclass(frozen=True)
class ModelShape:
    params: int
    largest_layer_params: int
    expert_params: int = 0
    """Of ``params``, the experts' (``moe_shapes.expert_param_count``): what ``--expert-parallel`` shards; 0: dense."""


@dataclass(frozen=True)
class Calibration:
    """What one measured run (or two of one family) says beyond the model states."""

    baseline_bytes: int
    activation_bytes_per_sample: float
    precision: str
    fixed_bytes: int = 0
    """Memory that does not scale with micro-batch, beyond the baseline: 0 from one run."""
    source: str = ""
    """The key(s) of the point(s) it was measured on."""


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
        return device, cpu_per_node / ranks_per_node
    if point.precision == "fp32":
        return _fp32_states(shape.params, shape.largest_layer_params, point, n)
    return _mixed_states(shape.params, point, n)


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


def calibrate(record: RunRecord | None, point: Layout, world_size: int, ranks_per_node: int, device_type: str,
              second: tuple[RunRecord, Layout] | None = None, expert_params: int = 0) -> Calibration | None:
    """The calibration from an ``ok`` run record of ``point``; None when it cannot give one.

    ``second``: an ``ok`` record of the same family at another micro-batch; then the per-sample
    figure is the slope between the two peaks and the rest above the model states is fixed.
    ``expert_params``: the experts' of the record's parameters (``ModelShape.expert_params``)."""
    measured = _measured(record, expert_params)
    if measured is None or point.micro_batch <= 0:
        return None
    peak, baseline, shape = measured
    states = model_states_bytes(shape, point, world_size, ranks_per_node, device_type)
    above = peak - baseline - states
    other = _measured(second[0], expert_params) if second else None
    if other is None or second[1].family != point.family or second[1].micro_batch == point.micro_batch:
        return Calibration(baseline, max(0.0, above / point.micro_batch), point.precision, source=point.key)
    slope = max(0.0, (other[0] - peak) / (second[1].micro_batch - point.micro_batch))
    fixed = max(0, int(above - slope * point.micro_batch))
    return Calibration(baseline, slope, point.precision, fixed, source=f"{point.key}; {second[1].key}")


def _measured(record: RunRecord | None, expert_params: int = 0) -> tuple[int, int, ModelShape] | None:
    if record is None or record.status != "ok":
        return None
    m = record.metrics
    if None in (record.params, record.largest_layer_params, m.peak_mem_bytes, m.baseline_mem_bytes):
        return None  # a record from before these fields existed
    return m.peak_mem_bytes, m.baseline_mem_bytes, ModelShape(record.params, record.largest_layer_params, expert_params)


def predict_peak_bytes(shape: ModelShape, point: Layout, world_size: int, ranks_per_node: int,
                       device_type: str, calibration: Calibration | None) -> int | None:
    """Peak memory of one rank for ``point``, in bytes; None without a calibration."""
    if calibration is None:
        return None
    states = model_states_bytes(shape, point, world_size, ranks_per_node, device_type)
    scale = ELEMENT_BYTES[point.precision] / ELEMENT_BYTES[calibration.precision]
    activations = calibration.activation_bytes_per_sample * point.micro_batch * scale
    return int(calibration.baseline_bytes + calibration.fixed_bytes + states + math.ceil(activations))


def fits(predicted: int | None, capacity: int, headroom_pct: float) -> bool:
    """Whether a predicted peak leaves ``headroom_pct`` percent of ``capacity`` free. No prediction
    fits: only a run can tell."""
    if not 0 <= headroom_pct < 100:
        raise ValueError(f"headroom_pct must be in [0, 100), got {headroom_pct}")
    return predicted is None or predicted <= capacity * (1 - headroom_pct / 100)


def device_capacity_bytes(device_type: str, ranks_per_node: int, cpu_mem_limit: int | None = None) -> int:
    """Memory one rank may use: a GPU's total memory (device 0), or on CPU ranks the
    ``--cpu-mem-limit`` cap, else the machine's MemTotal shared by its ranks."""
    if device_type == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    if device_type != "cpu":
        raise ValueError(f"device type {device_type!r}: capacity is known for cuda and cpu")
    if cpu_mem_limit:
        return int(cpu_mem_limit)
    return int(psutil.virtual_memory().total // max(1, ranks_per_node))
