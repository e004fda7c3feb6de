"""The run's state, stage by stage, as ``ds_bench.run.main`` carries it: ``Resolved`` (input checked
and resolved before joining, ``ds_bench.run.resolve``), ``Started`` (joined the process group: what the
run's records are made of, ``ds_bench.run.run_record``), ``Built`` (the engine that trains, and what was
read off the model before it was wrapped: ``ds_bench.run.training`` hands it to ``ds_bench.run.run_metrics``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ds_bench import engines
from ds_bench.cluster import process_group
from ds_bench.cluster.rendezvous import Rendezvous
from ds_bench.config.layout import Layout
from ds_bench.config.run_config import RunConfig
from ds_bench.machine.oom_kills import OomCounts
from ds_bench.measure import checkpoint
from ds_bench.measure.loop import LoopTimes
from ds_bench.workloads.base import Workload


@dataclass(frozen=True)
class Resolved:
    """A run whose input has been checked: what it joins with and what it builds after."""

    workload: Workload
    ds_cfg: dict
    """The resolved DeepSpeed config (``ds_bench.config.deepspeed.prepare``)."""
    engine: engines.EngineChoice
    rdzv: Rendezvous
    ckpt: checkpoint.Checkpointer
    layout: Layout
    """The layout that runs (``ds_bench.config.deepspeed.derive.layout_of_run`` of the resolved config): the record's."""
    optimizer_op: str | None
    """The JIT optimizer op DeepSpeed will load (DDP/FSDP: none, they use torch.optim)."""
    spawned_ops: tuple[str, ...] = ()
    """The JIT ops a process DeepSpeed spawns loads itself (``jit_ops.spawned_process_ops``)."""


@dataclass
class Started:
    """A run that has joined the process group: what its records are made of."""

    cfg: RunConfig
    ds_cfg: dict
    engine: engines.EngineChoice
    state: process_group.DistState
    size: str | None
    run_id: str
    peers: list[dict]
    """rank, host, pid and addrs (the host's IPv4 addresses) of every rank, to name a peer that died."""
    times: LoopTimes = field(default_factory=LoopTimes)
    links: frozenset = frozenset()
    """This rank's connections to other hosts' ranks once joined (``ds_bench.cluster.peer_links``)."""
    baseline_bytes: int = 0
    """Memory this rank held before the model was built (runtime, libraries, process group)."""
    ckpt: checkpoint.Checkpointer = field(default_factory=checkpoint.Checkpointer)
    """--checkpoint / --resume (``ds_bench.measure.checkpoint``); does nothing without them."""
    startup: dict = field(default_factory=dict)
    """Wall-clock marks and durations of this rank's start (``ds_bench.run.startup``)."""
    layout: Layout | None = None
    """The layout that runs (``Resolved.layout``): the record's ``layout``."""
    oom_counts: OomCounts | None = None
    """The host's and this cgroup's OOM kills when the run joined (``machine.oom_kills``): a peer that vanished
    while they rose was OOM-killed (``ds_bench.run.oom_victims``)."""


@dataclass(frozen=True)
class Built:
    """The engine that trains, and what was read off the whole model before it was wrapped."""

    engine: object
    params: int
    largest_layer_params: int
    flops_per_sample: float | None
    """Model FLOPs (``ds_bench.workloads.flops``), counted before ZeRO-3 partitions the weights."""
    hardware_flops_per_sample: float | None
    stages: list[dict] | None = None
    """Pipeline runs: each stage's layout (``stage_layout``) and build seconds, from its first data-parallel rank;
    ``run_metrics`` adds its timers, bubble and peak memory (``ds_bench.measure.stage_timers``)."""
    build: dict | None = None
    """The record's ``build`` (``ds_bench.record.run_schema.ModelBuild``): partitioned or not, times, memory."""
    settings: dict | None = None
    """Speed settings the built model runs with, record fields (``Workload.model_settings``)."""
    compile_backend: str | None = None
    """``--compile``: the backend the engine's model is compiled with (None: eager)."""
