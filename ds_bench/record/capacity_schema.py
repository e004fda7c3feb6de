"""The records of ``ds-bench capacity`` (``ds_bench.capacity``): a ``capacity_probe`` per member run
on a layout (the search's state), and one ``capacity`` record per layout when the search ends: the
largest family member that trained and what became of the next size. With ``--scale seq`` a member is the
model at one sequence length (``seq 8192``), the probe's ``index`` that length."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ds_bench.record.base_schema import Block, Busy, Record, SlurmJob


class CapacityProbeRecord(Record):
    """One family member run (a few steps) on one layout."""

    kind: Literal["capacity_probe"]
    capacity: str
    """The search's id (``CapacitySpec.capacity_id``): a re-run of the same search resumes from its probes."""
    layout: str
    """The layout's key, e.g. ``pp2 z1 off=none fp32 mbs=1``."""
    index: int
    """The member's position in the family, smallest first; with ``--scale seq`` its sequence length."""
    member: str
    run_args: list[str] = Field(default_factory=list)
    """The ``ds-bench run`` flags that build the member (``--layers``, ``--hidden``, ``--heads``...)."""
    seq_len: int | None = None
    """Tokens per sequence the probe ran (``--seq-len``); None in records written before it was kept."""
    params: int | None = None
    largest_layer_params: int | None = None
    status: str
    """``ok``, ``oom``, ``timeout`` or ``crashed`` (``ds_bench.jobs.outcome.classify``)."""
    reason: str | None = None
    world_size: int | None = None
    peak_mem_bytes: int | None = None
    """Bytes, the run's peak on its largest rank; None unless ok."""
    baseline_mem_bytes: int | None = None
    predicted_mem_bytes: int | None = None
    """Bytes per rank predicted before the probe ran (``ds_bench.perf.peak_memory``)."""
    capacity_bytes: int | None = None
    """Bytes of memory one rank may use."""
    step_s: float | None = None
    """Seconds, the median optimizer step (warm-up excluded)."""
    tokens_per_s: float | None = None
    """Global tokens per second."""
    tflops_per_device: float | None = None
    run_id: str | None = None
    ds_config: dict[str, Any] | None = None
    log: str | None = None
    wall_s: float | None = None
    """Seconds from launch to the job's end."""
    busy: Busy | None = None
    slurm: SlurmJob | None = None
    """``--executor slurm``: the batch job the probe ran as and how Slurm ended it."""
    time: str | None = None


class CapacityMember(Block):
    """A family member as a ``capacity`` record names it: its probe's figures (None where it was not run)."""

    member: str
    seq_len: int | None = None
    """``--scale seq``: the member's sequence length."""
    params: int | None = None
    status: str | None = None
    peak_mem_bytes: int | None = None
    predicted_mem_bytes: int | None = None
    step_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_device: float | None = None
    run_id: str | None = None
    why: str | None = None
    """The next size only: why it is not the largest (``oom``, ``predicted``...; ``capacity.search``)."""
    reason: str | None = None


class CapacityRecord(Record):
    """One layout's answer."""

    kind: Literal["capacity"]
    capacity: str
    layout: str | None = None
    point: dict[str, Any] = Field(default_factory=dict)
    """The layout's axes (``ds_bench.config.layout.Layout.to_dict``): stage, offload, precision, micro_batch..."""
    data_parallel_size: int | None = None
    world_size: int | None = None
    family: str | None = None
    scale: str | None = None
    """``--scale``: ``layers``, ``hidden`` or ``seq`` (the longest sequence: ``largest`` and ``next`` are lengths of
    one model); None for a ``--family`` and in records written before it was kept."""
    status: str
    """``ok`` (a member trained), ``failed`` (none did) or ``skipped`` (DeepSpeed cannot train the layout here)."""
    reason: str | None = None
    largest: CapacityMember | None = None
    """The largest member that trained."""
    next: CapacityMember | None = None
    """The member after it, and why it is not the largest."""
    capacity_bytes: int | None = None
    config: str | None = None
    """Path of the largest member's DeepSpeed config (``portable``: runs at any world size)."""
    time: str | None = None
