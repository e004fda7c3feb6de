"""The blocks a ``run`` record nests (``ds_bench.record.run_schema.RunRecord``): slow ranks, a pipeline's
stage timers and layout, the model build, where the start-up time went.
"""

from __future__ import annotations

from typing import Any

from ds_bench.record.base_schema import Block


class SlowRank(Block):
    """A rank whose compute time is above the median rank's by more than the threshold."""

    rank: int
    host: str | None = None
    compute_ms: float
    vs_median_pct: float
    """How much slower than the median rank, in percent (25.0: 1.25 x the median)."""


class StageTimes(Block):
    """One pipeline rank's time per pipeline instruction (``ds_bench.measure.stage_timers``): milliseconds, each
    summed over the step's micro-batches, the median over the measured steps (warm-up excluded). Taken around
    each instruction as the engine runs it; on a GPU from device events read after the step's one synchronize."""

    batch_load: float
    """``LoadMicroBatch``: reading the micro-batches (first and last stage; 0 on the others)."""
    forward_compute: float
    """``ForwardPass``: the stage's layers (on the last stage the LM head and the loss too)."""
    forward_recv: float
    """``RecvActivation``: receiving the previous stage's activations, mostly waiting for them."""
    forward_send: float
    """``SendActivation``: sending activations to the next stage."""
    backward_compute: float
    """``BackwardPass``: the backward of the stage's layers (recomputation included)."""
    backward_recv: float
    """``RecvGrad``: receiving the next stage's gradients, mostly waiting for them."""
    backward_send: float
    """``SendGrad``: sending gradients to the previous stage."""
    tied_grads_all_reduce: float
    """``ReduceTiedGrads``: the tied embedding / LM head gradient summed over the stages holding it."""
    grads_all_reduce: float
    """``ReduceGrads``: the data-parallel gradient all-reduce (nothing to reduce with one replica)."""
    optimizer: float
    """``OptimizerStep``."""
    other: float
    """The step less every instruction (per step, then the median): buffers, the loss broadcast, the synchronize."""
    step: float
    """This rank's step time (median)."""


class PipelineStage(Block):
    """One pipeline stage of a ``--pipeline-stages`` run, as its first data-parallel rank built it
    (``ds_bench.workloads.gpt2_pipe.GPT2Pipeline.stage_layout``)."""

    stage: int
    layers: list[int]
    """[first, stop): the ``PipelineModule`` layer indices this stage holds."""
    blocks: list[int]
    """[first, last] transformer block held (empty if none)."""
    n_blocks: int
    params: int
    """Parameters on this stage, a tied copy (the LM head's ``wte``) included."""
    unique_params: int
    """Without the tied copy: the stages' sum is the model's parameter count."""
    build_s: float | None = None
    """Seconds to build this stage's layers."""
    rank: int | None = None
    """The global rank whose timers these are: the stage's first data-parallel rank."""
    times_ms: StageTimes | None = None
    """That rank's pipeline-instruction timers (records from before: None)."""
    bubble: float | None = None
    """Measured idle share of the step (fraction, 0.2 = 20 %): 1 - (forward + backward compute) / step on
    each measured step, the median; beside ``RunRecord.schedule_bubble`` (``ds_bench.measure.stage_timers``)."""
    peak_mem_bytes: int | None = None
    """Bytes, the largest peak of the stage's ranks (GPU: max allocated; CPU: peak RSS)."""


class ModelBuild(Block):
    """How the model and engine were built on rank 0 (``ds_bench.run.training.build``). Memory is this rank's
    (GPU: allocated; CPU: RSS once the C heap returned its free pages, ``ds_bench.machine.memory.held_bytes``)
    minus what it held before the model (its own ``baseline_mem_bytes``)."""

    partitioned: bool
    """Whether the model was built under DeepSpeed ``zero.Init`` (ZeRO-3, a workload that allows it):
    each parameter partitioned across the ranks as it was created, no rank holding the whole model."""
    model_s: float
    """Seconds to build the model (construction, weight init, cast to the compute dtype)."""
    engine_s: float
    """Seconds from the model built (and its parameters and FLOPs counted) to the engine ready
    (``deepspeed.initialize``, or the DDP/FSDP wrap)."""
    model_mem_bytes: int
    """Bytes this rank held beyond its baseline once the model was built, before the engine."""
    engine_mem_bytes: int
    """Bytes this rank held beyond its baseline once the engine was ready (optimizer state that is
    created lazily, e.g. torch Adam's moments, not yet counted)."""
    rank_params: int | None = None
    """``--tensor-parallel``: parameters of rank 0's tensor-parallel share after the engine (its AutoTP shards
    plus the layers AutoTP replicates; under ZeRO-3 before partitioning), against the whole model's ``params``."""
    rank_params_held: dict[str, int] | None = None
    """``--workload moe`` under DeepSpeed: parameters rank 0 holds, ``experts`` (its E / EP) and ``rest``."""
    optimizer_state: dict[str, int] | None = None
    """DeepSpeed: what rank 0's optimizer held after the last step, live tensor bytes (``ds_bench.measure.
    optimizer_state``): ``master_bytes`` (its copy of the partition it updates), ``moments_bytes`` (Adam's moments,
    Muon's momentum) and ``muon_params`` (the model's parameters Muon steps)."""


class StartUp(Block):
    """Seconds from the process's start to the first measured step, by phase (``ds_bench.run.startup``
    says what each holds); rank 0's clock."""

    process_started_at: float | None = None
    """Unix time (s) rank 0's process started (``ds_bench.run.startup.process_start``)."""
    imports_s: float | None = None
    prepare_s: float | None = None
    ops_s: float | None = None
    process_group_s: float | None = None
    libraries_s: float | None = None
    model_build_s: float | None = None
    engine_s: float | None = None
    data_s: float | None = None
    compile_s: float | None = None
    """``--compile``: compiling in the warm-up steps (taken out of ``warmup_s``)."""
    warmup_s: float | None = None
    other_s: float | None = None
    total_s: float | None = None


class Compiled(Block):
    """``--compile``: what compiling cost and whether it settled in the warm-up
    (``ds_bench.measure.compile_stats`` defines each count; rank 0's, seconds also the slowest rank's)."""

    backend: str | None = None
    compile_s: float | None = None
    """Dynamo's frame + backward compile time on rank 0 (s), spent in warm-up steps, in no measured step."""
    compile_s_max: float | None = None
    frames_compiled: int | None = None
    graphs: int | None = None
    graph_breaks: int | None = None
    recompilations: int | None = None
    """Frames compiled after the first step (warm-up and window, every rank's most)."""
    inside_window: int | None = None
    """Frames compiled while the measured window was open, every rank's most: more than 0 fails the run."""


class DegreeComm(Block):
    """A parallel degree's own collectives on rank 0 (``ds_bench.measure.layout_comm``), one shape for every degree:
    AutoTP's all-reduces, Ulysses' all-to-alls, the MoE layer's dispatch and combine all-to-alls. Medians over the
    measured steps; each call timed as the layer makes it (on a GPU from device events read after the step's one
    synchronize), the wait for the slower rank of the group included."""

    collective: str
    """``all_reduce`` or ``all_to_all``."""
    ms_per_step: float | None = None
    """Milliseconds per step in the degree's collectives."""
    calls_per_step: int | None = None
    """Calls per step (a Llama block under AutoTP: 2 in forward, 5 in backward per micro-step; Ulysses: 4 and 4 per
    layer, 4 more with checkpointing; experts: 2 and 2 per MoE block, none at EP = 1)."""
    share_of_step: float | None = None
    """``ms_per_step`` over the rank's own step time."""
    bytes_per_step: float | None = None
    """Bytes rank 0 gave the collectives in a step (median)."""


class DegreeBlock(Block):
    """One parallel degree of a run (``ds_bench.engines.degrees.mesh``): its size, what its plan says of it, its own
    collectives and what else it measured."""

    size: int
    settings: dict[str, Any] | None = None
    """The plan's own settings: a pipeline's micro-batches, partition and schedule bubble (P - 1) / (m + P - 1);
    the experts' path, counts, expert-data-parallel size and router (top-k, capacity factor or None: no dropping,
    aux-loss weight)."""
    comm: DegreeComm | None = None
    measured: dict[str, Any] | None = None
    """Experts: the job's load balance (``ds_bench.measure.expert_load``): the busiest expert's tokens over the
    mean (``load_max_over_mean``, median over steps, and ``_worst``) and the share of routes dropped."""
