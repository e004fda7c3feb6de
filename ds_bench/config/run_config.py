"""The run configuration: every knob of one `ds-bench run`, validated once at load.

Precedence, as in torchtitan: command-line flag > DeepSpeed config file > default here. The
DeepSpeed JSON itself is resolved by ``ds_bench.config.deepspeed.prepare``; this module owns only ds_bench's own
settings. Anything invalid raises ``UserError`` naming the flag and what is expected.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass

from ds_bench.config import argcheck
from ds_bench.engines.plan import check_engine
from ds_bench.errors import UserError


@dataclass(frozen=True)
class RunConfig:
    """One benchmark run, as every rank executes it."""

    workload: str
    """Registered workload name (``ds_bench.workloads.REGISTRY``)."""
    ds_config: str
    """Path of the DeepSpeed JSON config."""
    steps: int = 50
    """Total optimizer steps, warm-up included."""
    warmup: int = 5
    """Leading steps excluded from every timing statistic."""
    micro_batch: int | None = None
    """Samples per device per micro-step; None: the config's value, else 32."""
    data: str = "synthetic"
    """``synthetic`` or a path the workload knows how to read."""
    results: str = "results/results.jsonl"
    """JSON-lines file rank 0 appends one record per run to."""
    seed: int = 0
    overrides: tuple[str, ...] = ()
    """``--set KEY=VALUE`` DeepSpeed overrides, dotted keys."""
    size: str | None = None
    """Named model size (workload flavour); None: the workload's default."""
    seq_len: int = 1024
    image_size: int | None = None
    num_classes: int | None = None
    model_path: str | None = None
    activation_checkpointing: bool = False
    peak_tflops: float | None = None
    """Override of the per-device peak used for MFU (dense TFLOP/s)."""
    lr: float | None = None
    """Learning rate used where the config says "auto"; None: the workload's default."""
    tag: str | None = None
    """Free label stored in the record; ``ds-bench sweep`` finds each point's run records by it."""
    iface: str | None = None
    """Network interface for the rendezvous (``--iface``); None: chosen automatically."""
    dist_timeout_s: float = 300.0
    """Timeout of process-group initialisation and of every collective."""
    connect_timeout_s: float = 30.0
    """How long a non-zero rank tries to reach MASTER_ADDR:MASTER_PORT before failing."""
    step_timeout_s: float = 1800.0
    """The step watchdog: a run in which no step finishes for this long dumps stacks and fails."""
    cpu_mem_limit: int | None = None
    """Bytes of private writable memory each rank may map (``ds_bench.machine.memory``); None: no cap."""
    slow_rank_threshold: float = 10.0
    """Percent above the median rank's compute time that names a rank slow (``ds_bench.measure.slow_ranks``)."""
    breakdown: bool = False
    """Synchronize after every phase (``ds_bench.measure.loop``'s ``breakdown`` mode) instead of once per step."""
    engine: str = "deepspeed"
    """``deepspeed``, ``ddp`` or ``fsdp`` (``ds_bench.engines``): what trains the model, from the same config."""
    busbw: float | None = None
    """busbw (GB/s) for the comm-bound verdict (``ds_bench.report.comm_bound``); None: a comm record's."""
    comm_results: str | None = None
    """Where to find ``ds-bench comm`` records; None: ``comm.jsonl`` beside ``results``."""
    checkpoint: str | None = None
    """Folder to save timed checkpoints in (``ds_bench.measure.checkpoint``); None: no checkpoint I/O."""
    checkpoint_every: int | None = None
    """Save after every global step that is a multiple of this; None: once, after the last step."""
    resume: str | None = None
    """Folder whose newest complete ds_bench checkpoint is loaded before the first step."""

    def __post_init__(self) -> None:
        argcheck.steps("--steps", self.steps, self.warmup)
        if self.micro_batch is not None:
            _require(self.micro_batch > 0, f"--micro-batch must be positive, got {self.micro_batch}")
        _require(self.seq_len > 0, f"--seq-len must be positive, got {self.seq_len}")
        for name in ("image_size", "num_classes", "peak_tflops", "lr", "slow_rank_threshold", "busbw"):
            value = getattr(self, name)
            _require(value is None or (math.isfinite(value) and value > 0),
                     f"--{name.replace('_', '-')} must be a finite number > 0, got {value}")
        check_engine(self.engine)
        check_timeout("--dist-timeout", self.dist_timeout_s)
        check_timeout("--connect-timeout", self.connect_timeout_s)
        check_timeout("--step-timeout", self.step_timeout_s)
        if self.checkpoint_every is not None:
            _require(self.checkpoint is not None, "--checkpoint-every needs --checkpoint DIR (where to save)")
            _require(self.checkpoint_every > 0, f"--checkpoint-every must be a positive integer, got {self.checkpoint_every}")
        if self.data != "synthetic" and not os.path.exists(self.data):
            raise UserError(f"--data {self.data}: no such file or folder (or use --data synthetic)")
        if self.comm_results is not None and not os.path.isfile(self.comm_results):
            raise UserError(f"--comm-results {self.comm_results}: no such file (records of ds-bench comm)")
        if self.model_path is not None and not os.path.isdir(self.model_path):
            raise UserError(f"--model {self.model_path}: not a folder with pretrained weights")
        if os.path.isdir(self.ds_config):
            raise UserError(f"--ds-config {self.ds_config}: is a folder; expected a DeepSpeed JSON file, "
                            "e.g. ds_configs/zero2.json")
        if not os.path.isfile(self.ds_config):
            raise UserError(f"--ds-config {self.ds_config}: file not found")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def comm_results_path(self) -> str:
        return self.comm_results or os.path.join(os.path.dirname(self.results), "comm.jsonl")


def check_timeout(flag: str, seconds: float) -> None:
    """Every distributed wait is bounded: a timeout must be a finite, positive number of seconds."""
    _require(math.isfinite(seconds) and seconds > 0, f"{flag} must be a finite number of seconds > 0, got {seconds}")


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)
