"""The ``run`` record (``ds-bench run``, ``ds_bench.run.run_record``): one per run from rank 0 when it
ended ok, one per failing rank when it failed; its ``metrics`` block and its ``failure``.

Records written before ``kind`` was (no ``kind`` key) are run records. Definitions of the metrics:
``ds_bench.measure.metrics`` (reductions over ranks) and ``ds_bench.run.training`` (throughput, FLOPs).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from ds_bench.config.deepspeed.derive import layout_of_run
from ds_bench.config.degrees import legacy
from ds_bench.record.base_schema import Block, Stamped
from ds_bench.record.run_blocks import (
    Compiled,
    DegreeBlock,
    ModelBuild,
    PipelineStage,
    SlowRank,
    StartUp,
)


class RunMetrics(Block):
    """What a run measured, over the measured steps only (warm-up excluded). Empty on a failed run
    that finished no step; on a failed run, the failing rank's own figures (``partial_from_rank``)."""

    steps_measured: int | None = None
    samples_per_s: float | None = None
    """Global samples (images, sequences) per second: train_batch_size x steps / sum of straggler step times."""
    samples_per_s_per_device: float | None = None
    """``samples_per_s`` / world size."""
    tokens_per_s: float | None = None
    """``samples_per_s`` x tokens per sample (token workloads only)."""
    sample_unit: str | None = None
    """What a sample is: ``images``, ``sequences``, ``samples``."""
    step_ms_median: float | None = None
    """Median step time in ms; a step's time is the slowest rank's (the straggler)."""
    step_ms_p90: float | None = None
    step_ms_mean: float | None = None
    step_ms_min: float | None = None
    step_ms_max: float | None = None
    breakdown_ms_median: dict[str, float] | None = None
    """Phase (data, forward, backward, optimizer) -> median straggler time in ms."""
    timing_mode: str | None = None
    """``step`` (one synchronize per step) or ``breakdown`` (one per phase; ``--breakdown``)."""
    syncs_per_step: int | None = None
    peak_mem_bytes: int | None = None
    """Bytes, max over ranks of each rank's peak (GPU: max allocated; CPU: peak RSS)."""
    peak_mem_bytes_mean: int | None = None
    """Bytes, mean over ranks of each rank's peak."""
    peak_mem_kind: str | None = None
    """``allocated`` (GPU) or ``rss`` (CPU): what ``peak_mem_bytes`` counts."""
    peak_mem_reserved_bytes: int | None = None
    """GPU only: bytes, max over ranks of the caching allocator's peak reserved memory."""
    baseline_mem_bytes: int | None = None
    """Bytes, max over ranks of what a rank held before the model was built."""
    loss_first: float | None = None
    loss_last: float | None = None
    loss_curve: list[float] | None = None
    """Loss of every step (warm-up included), mean over ranks, rounded to 6 digits."""
    grad_norm_curve: list[float | None] | None = None
    """Global gradient norm (before clipping) of every step, warm-up included, as the engine computed it at the
    step's optimizer step (``ds_bench.measure.loop.grad_norm``), 6 significant digits; None at a step, or for
    the whole run, where the engine computed none."""
    compute_ms_per_rank: list[float] | None = None
    """Each rank's median forward + backward time in ms, indexed by rank."""
    host_per_rank: list[str] | None = None
    window_wall_s: float | None = None
    """Seconds, wall time of the measured window, barrier to barrier (max over ranks)."""
    steps_sum_s: float | None = None
    """Seconds, sum of the straggler step times (what ``samples_per_s`` divides by)."""
    steps_vs_wall_pct: float | None = None
    """(steps_sum_s / window_wall_s - 1) x 100."""
    rank_steps_vs_wall_pct: float | None = None
    """The rank whose own steps differ most from its own window, in % (a check of the harness's clock)."""
    tflops_per_device: float | None = None
    """Model FLOPs x samples/s / devices / 1e12."""
    mfu: float | None = None
    """Model FLOPs utilisation, a fraction of ``peak_tflops`` (0.4 = 40 %); None without a peak."""
    mfu_note: str | None = None
    """Where the peak came from, or why there is no MFU."""
    mfu_vs_measured: float | None = None
    """``tflops_per_device`` / ``measured_tflops``: utilisation of what this device was measured to do."""
    measured_tflops: float | None = None
    """The device's best measured dense matmul TFLOP/s in the run's dtype, from the newest roofline record of
    this host (``ds-bench roofline``)."""
    measured_note: str | None = None
    """Where ``measured_tflops`` came from, or why there is none."""
    peak_tflops: float | None = None
    """Dense peak TFLOP/s per device the MFU is taken against."""
    model_flops_per_step: float | None = None
    """Model FLOPs of one optimizer step over the whole batch."""
    hardware_tflops_per_device: float | None = None
    """As ``tflops_per_device``, counting recomputed FLOPs (activation checkpointing)."""
    hfu: float | None = None
    """Hardware FLOPs utilisation (fraction), with recomputation."""
    partial_from_rank: int | None = None
    """Failed runs: the rank whose own, unreduced, figures these are."""


class OomKill(Block):
    """A rank the kernel's OOM killer ended, as a surviving peer on its host found it (``ds_bench.run.oom_victims``):
    the rank wrote nothing itself."""

    pid: int
    signal: str = "SIGKILL"
    """What the OOM killer sends (``mm/oom_kill.c``); the process cannot catch it."""
    rss_bytes: int | None = None
    """The rank's resident memory (anon + file + shmem) at the kill, from the kernel's log; None: log not readable."""
    cause: str | None = None
    """``cgroup limit`` (the kernel logged CONSTRAINT_MEMCG, or the cgroup's own count rose) or ``machine memory``."""
    evidence: str = ""
    """``kernel log`` (a line names the rank's pid) or ``oom_kill counters`` (they rose while the rank vanished)."""
    kernel_oom_kills: int | None = None
    """How much /proc/vmstat's ``oom_kill`` rose during the run."""
    cgroup_oom_kills: int | None = None
    """How much the memory cgroup's ``oom_kill`` rose during the run."""
    cgroup: str | None = None
    """The file counting the cgroup's kills."""
    reported_by: int | None = None
    """The surviving rank that wrote this record."""


class Failure(Block):
    """Why a rank's run ended early (``ds_bench.run.run_record.failure_record``)."""

    kind: str
    """``oom``, ``stalled``, ``terminated`` or ``error``."""
    steps_done: int | None = None
    rank: int | None = None
    host: str | None = None
    signal: str | None = None
    """Name of the termination signal received, e.g. ``SIGTERM``."""
    stalled_s: float | None = None
    """Seconds without a finished step before the step watchdog fired."""
    peers: dict[str, str] = Field(default_factory=dict)
    """Rank (as text) -> ``gone`` or ``stopped`` (a peer process on this host, from /proc), ``oom`` (gone, ended by
    the kernel's OOM killer: ``oom_kill``), or ``lost`` (a rank on another host whose address the error names: a
    connection reset or closed by it)."""
    oom_kill: OomKill | None = None
    """``kind == "oom"`` for a rank the OOM killer ended: the evidence (written by a surviving peer)."""


class RunRecord(Stamped):
    kind: Literal["run"] = "run"
    workload: str
    layout: dict[str, Any] | None = None
    """The ``Layout`` the run trained (``Layout.to_dict()``: engine, ZeRO stage, offload, precision, micro-batch,
    accumulation, every parallel degree, attention, compile, the memory switches), from its ``config`` and
    ``ds_config`` (``ds_bench.config.deepspeed.derive.layout_of_run``); a record written before it had one is read
    with it."""
    layout_key: str | None = None
    """``layout``'s key (``z1 off=none fp32 mbs=4``, ``tp2 z1 ...``): what ``compare`` matches runs on."""
    status: str | None = None
    """``ok`` or ``failed``."""
    error: str | None = None
    """Failed runs: why, in one line."""
    size: str | None = None
    tag: str | None = None
    """``--tag``; a sweep or scaling point finds its runs by it."""
    world_size: int | None = None
    launcher: str | None = None
    master_addr: str | None = None
    rendezvous: dict[str, Any] | None = None
    """Where the ranks met (``Rendezvous.describe``: address, port, interface and why) and ``shm_buffer_released``:
    on CPU ranks, whether rank 0 unlinked a DeepSpeed shm all-reduce buffer (the op was on); None on GPU ranks."""
    backend: str | None = None
    engine: str = "deepspeed"
    """``deepspeed``, ``ddp`` or ``fsdp`` (records from before engines were choosable: deepspeed)."""
    engine_plan: dict[str, Any] | None = None
    """DDP/FSDP: how the DeepSpeed config was mapped (``ds_bench.engines.torch_settings``); None for DeepSpeed."""
    ds_config: dict[str, Any] | None = None
    """The resolved DeepSpeed config, as ``deepspeed.initialize`` got it."""
    zero_stage: int | None = None
    precision: str | None = None
    precision_emulated: bool | None = None
    """CPU runs: True when ``precision`` is emulated on this CPU (bf16 without avx512_bf16/AMX/Arm bf16),
    several times slower than fp32; ``precision_note`` says so (records from before, GPU runs: None)."""
    precision_note: str | None = None
    """Why ``precision_emulated`` is True, with the fp32 alternative (``--set bf16.enabled=false``)."""
    optimizer: dict[str, Any] | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    train_batch_size: int | None = None
    hardware: dict[str, Any] = Field(default_factory=dict)
    """``device``, ``device_type``; on CPU also ``cpu_count``, ``torch_threads``."""
    metrics: RunMetrics = Field(default_factory=RunMetrics)
    failure: Failure | None = None
    loop_started_at: float | None = None
    """Unix time (s) the timed loop started: a sweep point's launch overhead is from its launch to this."""
    params: int | None = None
    """Parameters of the whole model (partitioned builds: ``ds_numel``, not this rank's share)."""
    largest_layer_params: int | None = None
    """Parameters of the largest module (its own, not its children's): whole-model counts when partitioned."""
    build: ModelBuild | None = None
    """Model build and engine init: times, memory, partitioned or not (records from before: None)."""
    startup: StartUp | None = None
    """Where the time before the first measured step went (records from before: None)."""
    compile: Compiled | None = None
    """``--compile``: compile time, graphs, graph breaks, recompilations (None: not compiled)."""
    attn_implementation: str | None = None
    """The attention implementation the built model runs (HF ``_attn_implementation``, read back from the
    model: ``sdpa``, ``eager``, ``flash_attention_2``); None for workloads without attention."""
    activation_function: str | None = None
    """The MLP activation the built model runs (HF ``activation_function``; GPT-2: ``gelu_pytorch_tanh``,
    ``ds_bench.workloads.gpt2.FUSED_GELU``); None for workloads without one."""
    tokenizer: str | None = None
    """What tokenized a language model's ``--data``: the ``--model`` folder's own tokenizer (its path), or
    ``gpt2-bpe`` (``ds_bench.data.tokenizer``); None for synthetic tokens."""
    memory_format: str | None = None
    """ResNet: its first convolution's weight layout after the engine wrapped it (``channels_last`` with
    ``--channels-last``, ``contiguous``, ``partitioned`` under ZeRO-3)."""
    hosts: list[str] | None = None
    slow_ranks: list[SlowRank] | None = None
    comm_bound: dict[str, Any] | None = None
    """The comm-bound verdict (``ds_bench.perf.comm_bound.for_run``): a ``note``, or bus bytes per step,
    busbw (GB/s), the lower bound of communication time (ms) and its fraction of the step."""
    checkpoint: dict[str, Any] | None = None
    """``--checkpoint``: save and load-back times (s), bytes and GB/s (``ds_bench.measure.checkpoint.figures``)."""
    resumed_from_step: int | None = None
    resume: dict[str, Any] | None = None
    """``--resume``: the checkpoint loaded (``dir``, ``tag``), its load time (s), bytes and GB/s."""
    data_parallel_size: int | None = None
    """Runs with a parallel degree: the data-parallel replicas, world size / the degrees whose groups share one."""
    degrees: dict[str, DegreeBlock] | None = None
    """Each parallel degree that ran (``ds_bench.config.degrees``: ``pipeline_stages``, ``tensor_parallel``,
    ``sequence_parallel``, ``expert_parallel``, ...) by its field: size, settings, its own collectives
    (``ds_bench.measure.degree_blocks``); None: data parallelism only. Records from before the map are read with
    one (``ds_bench.config.degrees.legacy``)."""
    memory_options: list[str] | None = None
    """The long-context memory options that ran (``activation_checkpointing``, ``checkpoint_offload``,
    ``tiled_mlp``, ``tiled_loss``: ``ds_bench.engines.tiling``); None: none."""
    pipeline_layout: list[PipelineStage] | None = None
    """Pipeline runs: each stage's blocks and parameters, its timers, measured bubble and peak memory."""

    def degree_size(self, field: str) -> int | None:
        """The size of one degree that ran; None: it did not."""
        block = (self.degrees or {}).get(field)
        return block.size if block else None

    def setting(self, key: str):
        """A degree's setting (``DegreeBlock.settings``: e.g. a pipeline's ``schedule_bubble``); None: no degree
        that ran has it."""
        return next((b.settings[key] for b in (self.degrees or {}).values() if b.settings and key in b.settings),
                    None)


    @model_validator(mode="before")
    @classmethod
    def _with_layout(cls, data: Any) -> Any:
        """Every run record carries its degrees in one map and its layout: the map read from an old record's keys,
        the layout computed once from the record's own flags and DeepSpeed config where it has none (a new record
        as it is built; an old one as it is read)."""
        if not isinstance(data, dict):
            return data
        data = legacy.migrate(data)
        if data.get("layout") is not None:
            return data
        config, ds_cfg = data.get("config") or {}, data.get("ds_config")
        if not isinstance(config, dict) or not isinstance(ds_cfg, (dict, type(None))):
            return data
        try:
            layout = layout_of_run(config, ds_cfg, data)
        except (TypeError, ValueError, KeyError, AttributeError):
            return data  # a record too old or too partial to say
        return {**data, "layout": layout.to_dict(), "layout_key": layout.key}
