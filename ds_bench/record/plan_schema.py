"""The record of ``ds-bench plan`` (``ds_bench.plan``): one ``plan`` record per plan, with the cluster it
modelled (each figure's source), the ranked candidates and their predicted step broken down, the dropped ones
grouped by why, and, with ``--confirm``, what the best ones measured beside their prediction."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from ds_bench.record.base_schema import Block, Stamped


class Confirmed(Block):
    """A ranked layout run for real (``--confirm``)."""

    status: str
    """``ok``, ``oom``, ``timeout`` or ``crashed`` (``ds_bench.jobs.outcome.classify``)."""
    reason: str | None = None
    tag: str | None = None
    run_id: str | None = None
    step_s: float | None = None
    """Measured median step, seconds."""
    tokens_per_s_per_rank: float | None = None
    peak_mem_bytes: int | None = None
    ratio: float | None = None
    """Predicted / measured step time."""
    flagged: bool = False
    """The ratio is outside the plan's stated band (``ds_bench.plan.confirm.BAND``)."""


class ScaledTo(Block):
    """``--scale``: the largest member of the model family this row's layout fits (``ds_bench.perf.scale``)."""

    axis: str
    """``layers``, ``hidden`` or ``seq``."""
    value: int
    params: int
    layers: int
    hidden: int
    heads: int
    seq_len: int
    sequences: int
    """Per step at that size (``seq``: one per data-parallel replica)."""
    capped: bool = False
    """It fit at the search's limit (``perf.scale.LIMIT``): the largest is at least ``value``."""


class PlanRow(Block):
    """One ranked candidate's prediction (``ds_bench.perf.step``, ``ds_bench.perf.memory``)."""

    rank: int
    label: str
    """``tp2 dp4 z1 off=none bf16 mbs=2 ga=8 ckpt``."""
    point: dict[str, Any]
    """The ``Layout``'s fields (``Layout.to_dict``)."""
    checkpointing: bool = False
    checkpoint_offload: bool = False
    selective_checkpointing: bool = False
    tokens_per_s_per_rank: float
    mfu: float
    step_s: float
    compute_s: float
    bubble_s: float = 0.0
    optimizer_s: float = 0.0
    exposed_s: dict[str, float] = Field(default_factory=dict)
    """Collective -> seconds the step waits for it."""
    comm_s: dict[str, float] = Field(default_factory=dict)
    """Collective -> seconds on the bus, before overlap."""
    busbw_GBps: dict[str, float] = Field(default_factory=dict)
    memory_bytes: int
    states_bytes: int
    activations_bytes: int
    logits_bytes: int
    reserve_bytes: int
    scaled: ScaledTo | None = None
    confirmed: Confirmed | None = None


class DroppedGroup(Block):
    """Candidates dropped for one reason: the legality rule's name, ``model``, ``batch`` or ``memory``."""

    rule: str
    count: int
    examples: list[str] = Field(default_factory=list)
    """``label: why`` of the first few (for ``memory``: the closest to fitting)."""


class PlanRecord(Stamped):
    kind: Literal["plan"]
    status: str
    """``ok``; ``failed`` when a ``--confirm`` run failed."""
    workload: str
    size: str
    params: int
    seq_len: int
    global_batch_tokens: int
    sequences: int
    precision: str
    cluster: dict[str, Any] = Field(default_factory=dict)
    """nodes, per_node, device, memory_bytes, peak_tflops, achieved, intra_busbw_GBps, nic_GBps, hbm_GBps,
    reserve_bytes and ``sources`` (figure -> where it came from)."""
    candidates: int = 0
    ranked: list[PlanRow] = Field(default_factory=list)
    """The best ``--top`` of them, best first."""
    feasible: int = 0
    """Candidates that fit and are legal (ranked)."""
    dropped: list[DroppedGroup] = Field(default_factory=list)
    recommended_config: str | None = None
    """The best layout's DeepSpeed config, as written (portable)."""
    confirm_median_ratio: float | None = None
    scale: str | None = None
    """``--scale``'s axis: each row is its layout's largest member along it (``PlanRow.scaled``)."""
    notes: list[str] = Field(default_factory=list)
