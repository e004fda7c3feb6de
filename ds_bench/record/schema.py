"""The record schema: every kind of JSON-lines record ds_bench writes, as typed models, and the one
place a line becomes a typed record (``parse_record``). Writers build these models and append them
with ``store.append_record``; readers get them from ``store.read_records``.

Kinds (the ``kind`` key; a record without one is a ``run`` record, as every run record written
before ``schema_version`` 1 is):
- ``run``: ``RunRecord`` (``ds_bench.record.run_schema``), from ``ds-bench run``;
- ``sweep_point``: ``SweepPointRecord``, one per attempt of a sweep point (``ds_bench.sweep.point_record``);
- ``scaling``: ``ScalingRecord``, one per ``ds-bench scaling``, a ``ScalingRow`` per point;
- ``comm``: ``CommRecord``, one per ``ds-bench comm``, a ``CommRow`` per collective, size and group;
- ``doctor``: ``DoctorRecord``, ``ds-bench doctor --json``;
- ``capacity_probe`` and ``capacity``: ``ds-bench capacity`` (``ds_bench.record.capacity_schema``);
- ``plan``: ``ds-bench plan`` (``ds_bench.record.plan_schema``).
``ds-bench schema`` (``ds_bench.commands.schema``) prints the JSON Schema of them all (``json_schema``),
which ``docs/record.schema.json`` is.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Field, TypeAdapter

from ds_bench.record.base_schema import SCHEMA_VERSION, Block, Busy, PointTime, Record, SlurmJob, Stamped
from ds_bench.record.capacity_schema import CapacityMember, CapacityProbeRecord, CapacityRecord
from ds_bench.record.plan_schema import PlanRecord
from ds_bench.record.run_schema import Failure, ModelBuild, OomKill, RunMetrics, RunRecord, SlowRank

__all__ = ["SCHEMA_VERSION", "Block", "Busy", "CapacityMember", "CapacityProbeRecord", "CapacityRecord", "CommRecord", "CommRow", "DoctorRecord", "Failure", "ModelBuild", "OomKill", "PlanRecord", "PointTime", "Record",
           "RunMetrics", "RunRecord", "ScalingRecord", "ScalingRow", "SlowRank", "SlurmJob", "Stamped", "SweepPointRecord",
           "json_schema", "model_of", "parse_record"]


class SweepPointRecord(Record):
    """One attempt (repeat) of a sweep point; the latest per (``sweep``, ``key``, ``repeat``) counts."""

    kind: Literal["sweep_point"]
    sweep: str
    """The sweep's id (``SweepSpec.sweep_id``): a re-run of the same sweep resumes from its records."""
    key: str
    """The point's key, e.g. ``z2 off=none bf16 mbs=8``."""
    point: dict[str, Any] = Field(default_factory=dict)
    """The point's axes (``ds_bench.config.layout.Layout.to_dict``): stage, offload, precision, micro_batch..."""
    repeat: int = 0
    status: str
    """``ok``, ``oom``, ``skipped``, ``timeout`` or ``crashed``."""
    reason: str | None = None
    workload: str | None = None
    size: str | None = None
    world_size: int | None = None
    unit: str | None = None
    """Unit of ``throughput``: ``tokens/s``, ``images/s``..."""
    throughput: float | None = None
    """Global, in ``unit``; None unless ok."""
    peak_mem_bytes: int | None = None
    """Bytes, the run's peak on its largest rank; None unless ok."""
    baseline_mem_bytes: int | None = None
    predicted_mem_bytes: int | None = None
    """Bytes per rank predicted before launch (``ds_bench.perf.peak_memory``)."""
    capacity_bytes: int | None = None
    """Bytes of memory one rank may use."""
    run_id: str | None = None
    ds_config: dict[str, Any] | None = None
    """The resolved DeepSpeed config of the run."""
    log: str | None = None
    params: int | None = None
    largest_layer_params: int | None = None
    wall_s: float | None = None
    """Seconds from launch to the job's end."""
    launched_at: float | None = None
    """Unix time (s)."""
    ended_at: float | None = None
    loop_started_at: float | None = None
    time_split: PointTime | None = None
    """Where the attempt's wall time went, launch to exit (None without the run's start-up marks)."""
    busy: Busy | None = None
    slurm: SlurmJob | None = None
    """``--executor slurm``: the batch job the attempt ran as and how Slurm ended it."""
    time: str | None = None
    bubble: float | None = None
    """Pipeline points: the measured bubble (fraction of the step), the mean over stages of each stage's
    ``PipelineStage.bubble``: the share of the pipeline's device time spent idle. None otherwise."""
    schedule_bubble: float | None = None
    """Pipeline points: the schedule's (P - 1) / (m + P - 1), beside ``bubble``."""
    versions: dict[str, str | None] | None = None
    """The versions the point's run recorded (python, torch, deepspeed, transformers, ...): its stack's, measured."""
    loss_curve: list[float] | None = None
    """The run's loss of every step (``RunMetrics.loss_curve``): what ``compare --stacks`` checks beside speed."""
    grad_norm_curve: list[float | None] | None = None
    """The run's global gradient norm of every step (``RunMetrics.grad_norm_curve``)."""


class ScalingRow(Block):
    """One point (rank count) of a scaling record (``ds_bench.scaling.efficiency.row``)."""

    world_size: int
    nodes: int | None = None
    ranks_per_node: int | None = None
    hosts: list[str] = Field(default_factory=list)
    status: str
    """``ok`` or ``failed``."""
    reason: str | None = None
    tag: str | None = None
    run_id: str | None = None
    log: str | None = None
    torch_threads: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    unit: str = "samples/s"
    samples_per_s: float | None = None
    samples_per_s_per_device: float | None = None
    tokens_per_s_per_device: float | None = None
    step_ms_median: float | None = None
    step_ms_p90: float | None = None
    efficiency: float | None = None
    """Per-device throughput / that of the baseline (smallest ok) point; 1.0 = perfect weak scaling."""
    wall_s: float | None = None
    busy: Busy | None = None
    slurm: SlurmJob | None = None
    """``--executor slurm``: the batch job the point ran as and how Slurm ended it."""


class ScalingRecord(Stamped):
    kind: Literal["scaling"]
    scaling: str
    """The scaling run's id; its points' run records carry the tag ``scaling:<id>:n<ranks>``."""
    status: str
    workload: str | None = None
    ds_config: str | None = None
    """Path of the DeepSpeed config."""
    launcher: str | None = None
    hostfile: str | None = None
    device_type: str | None = None
    machine: dict[str, Any] = Field(default_factory=dict)
    stack: str | None = None
    """The stack its points ran on (``config.stacks.Stack.label``: ``ds0.18.4``) where the study had a stack axis."""
    threads_per_rank: int | None = None
    micro_batch: int | None = None
    grad_accum: int | None = None
    baseline_world_size: int | None = None
    points: list[ScalingRow] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    runs: str | None = None
    """Path of the points' run records."""
    table: str | None = None
    plot: str | None = None


class CommRow(Block):
    """One collective at one size over one group of ranks (``ds_bench.comm.table.rows``)."""

    scope: str = "world"
    """``world`` (all ranks), ``intra``/``inter`` host groups, or ``pair`` (one link)."""
    group: str | None = None
    collective: str
    size_bytes: int
    count: int | None = None
    time_us: float | None = None
    """Microseconds, mean over ranks of each rank's mean time."""
    time_us_median: float | None = None
    time_us_min: float | None = None
    time_us_max: float | None = None
    algbw_GBps: float | None = None
    """size / time, in GB/s (1e9 bytes/s)."""
    busbw_GBps: float
    """Bus bandwidth, GB/s (1e9 bytes/s), as nccl-tests defines it."""
    wrong: list[str] = Field(default_factory=list)
    """One line per rank whose result was wrong."""


class CommRecord(Stamped):
    kind: Literal["comm"]
    status: str
    problems: list[str] = Field(default_factory=list)
    world_size: int | None = None
    hosts: list[str] = Field(default_factory=list)
    """Host name of every rank, in rank order."""
    launcher: str | None = None
    backend: str | None = None
    rendezvous: dict[str, Any] | None = None
    hardware: dict[str, Any] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    dtype: str | None = None
    warmup: int | None = None
    iters: int | None = None
    results: list[CommRow] = Field(default_factory=list)
    note: str | None = None
    slow_links: list[dict[str, Any]] | None = None
    """``--pairs``: links more than the threshold below the best (``link``, ``busbw_GBps``, ``vs_best_pct``)."""
    suspect_hosts: list[str] | None = None


class DoctorRecord(Record):
    kind: Literal["doctor"]
    ranks: list[dict[str, Any]] = Field(default_factory=list)
    """Each rank's facts (``ds_bench.comm.doctor.rank_facts``): host, device, interfaces, env, versions."""
    problems: list[str] = Field(default_factory=list)
    allreduce_bytes: int | None = None
    allreduce_ms: float | None = None
    busbw_GBps: float | None = None
    links: list[dict[str, Any]] | None = None
    roofline: list[dict[str, Any]] | None = None
    """Every rank's short ceiling check (``ds_bench.comm.doctor.ceiling_check``): RooflineRow fields."""


class RooflineRow(Block):
    """One measured rate of one rank's device (``ds_bench.measure.ceilings``)."""

    rank: int
    host: str
    device: str
    """``torch.cuda.get_device_name``, or the CPU's model name."""
    test: str
    """``matmul`` (TFLOP/s, dense n x n), ``gemm`` (TFLOP/s, a run's own m x k by k x n) or ``copy`` (GB/s,
    bytes read + written)."""
    dtype: str
    size: int
    """matmul: n; gemm: m; copy: bytes."""
    name: str | None = None
    """gemm: which product of the run (``ds_bench.workloads.gpt2_shapes.gemms``)."""
    shape: list[int] | None = None
    """gemm: [m, k, n]."""
    median: float
    low: float
    high: float
    iters: int
    repeats: int


class RooflineRecord(Stamped):
    kind: Literal["roofline"]
    world_size: int | None = None
    min_time_s: float | None = None
    results: list[RooflineRow] = Field(default_factory=list)


AnyRecord = Annotated[Union[RunRecord, SweepPointRecord, ScalingRecord, CommRecord, DoctorRecord, CapacityProbeRecord,
                            CapacityRecord, RooflineRecord, PlanRecord], Field(discriminator="kind")]
KINDS: dict[str, type[Record]] = {"run": RunRecord, "sweep_point": SweepPointRecord, "scaling": ScalingRecord,
                                  "comm": CommRecord, "doctor": DoctorRecord, "capacity_probe": CapacityProbeRecord,
                                  "capacity": CapacityRecord, "roofline": RooflineRecord, "plan": PlanRecord}


def model_of(data: Any) -> type[Record] | None:
    """The model of a decoded line; None for what is no ds_bench record (another kind, a kindless
    line without ``workload``: read_records has always skipped those)."""
    if not isinstance(data, dict):
        return None
    if "kind" not in data:
        return RunRecord if "workload" in data else None
    return KINDS.get(data["kind"])


def parse_record(data: Any) -> Record | None:
    """The typed record of a decoded line, None when it is none (``model_of``); a line of a known kind
    that does not fit its model raises ``pydantic.ValidationError`` (a ``ValueError``)."""
    model = model_of(data)
    return None if model is None else model.model_validate(data)


def json_schema() -> dict:
    """JSON Schema (draft 2020-12) of a record of any kind."""
    schema = TypeAdapter(AnyRecord).json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "ds_bench record",
            "description": f"One JSON line of a ds_bench results file, schema_version {SCHEMA_VERSION}.", **schema}
