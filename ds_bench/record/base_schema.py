"""The parts every record kind shares: the schema version, the base model, the fields
``store.base_record`` fills (who wrote the record, where, with what) and the ``busy`` probe.

Every model keeps keys it does not declare (``extra="allow"``), so a record from a newer or older
writer survives a round trip; every field an older record may lack has a default.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
"""Written into every record as ``schema_version``; records from before it was written read as 0."""


class Block(BaseModel):
    """A typed block inside a record (a table row, the metrics); keeps undeclared keys."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)


class Record(Block):
    """A top-level record: one JSON line of a results file."""

    schema_version: int = 0
    """``SCHEMA_VERSION`` of the writer (stamped by ``store.append_record``); 0: written before it existed."""

    def to_json_dict(self) -> dict[str, Any]:
        """The line's content: the keys the writer set (none invented), its ``kind`` and this schema version."""
        out = self.model_dump(mode="python", exclude_unset=True)
        out["kind"] = getattr(self, "kind")
        out["schema_version"] = SCHEMA_VERSION
        return out


class Stamped(Record):
    """The fields ``store.base_record`` writes: run, scaling and comm records."""

    run_id: str | None = None
    """``YYYYmmddTHHMMSS-<8 hex>``, shared by every rank's record of one run."""
    time: str | None = None
    """Local time the record was written, ``%Y-%m-%dT%H:%M:%S%z``."""
    host: str | None = None
    """Host name of the writing rank."""
    versions: dict[str, str | None] = Field(default_factory=dict)
    """python, torch, deepspeed, transformers, datasets, mpi4py, cuda, nccl (None: not installed)."""
    git_sha: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    """The command's resolved options (``RunConfig.to_dict``, ``ScalingSpec.to_dict``, ``CommSpec.to_dict``)."""


class Busy(Block):
    """Other work on the machine while a job ran (``ds_bench.jobs.outcome.BusyProbe``)."""

    load_before: float | None = None
    """1-minute load average before the job started."""
    load_after: float | None = None
    other_cores: float | None = None
    """CPU time of other processes / wall time: cores' worth of other work (0.5: half a core)."""
    cores: int | None = None
    gpu_others: list[dict[str, Any]] = Field(default_factory=list)
    """Compute processes on the GPUs that were not the job's: ``pid``, ``used_mib``."""


class SlurmJob(Block):
    """The Slurm batch job a study point ran as (``--executor slurm``), as Slurm tells its end
    (``ds_bench.jobs.slurm_batch.SlurmEnd``)."""

    job_id: str
    state: str
    """Slurm's job state: ``COMPLETED``, ``FAILED``, ``TIMEOUT``, ``CANCELLED``, ``NODE_FAIL``, ``OUT_OF_MEMORY``..."""
    reason: str | None = None
    """Slurm's reason field (``NodeDown``, ``TimeLimit``...); None when it gave none."""
    exit_code: int | None = None
    signal: int | None = None
    """Slurm's exit state ``code:signal`` of the batch script."""
    nodes: str | None = None
    """The job's node list, as Slurm writes it (``hosta,hostb``, ``node[01-04]``)."""


class PointTime(Block):
    """Where one study job's wall time went, launch to exit, in seconds (``ds_bench.jobs.point_time``; rank 0's
    clock for the phases inside the run, the study's for the launch and the end)."""

    launcher_s: float | None = None
    """The job started -> rank 0's process started: the launcher's own start (its interpreter and imports)."""
    imports_s: float | None = None
    """Rank 0's interpreter, torch and ds_bench imports, argument parsing."""
    prepare_s: float | None = None
    ops_s: float | None = None
    process_group_s: float | None = None
    libraries_s: float | None = None
    """The libraries every run loads, before its memory baseline: ``torch._dynamo``, and DeepSpeed's optimizer stack
    under ``--engine deepspeed`` (``ds_bench.run.training.PRELOADED``, ``DEEPSPEED_PRELOADED``)."""
    build_s: float | None = None
    """Model, engine, first batch and what lies between the phases before the warm-up."""
    warmup_s: float | None = None
    """Warm-up steps, compile included."""
    measured_s: float | None = None
    """The measured window (``window_wall_s``)."""
    exit_s: float | None = None
    """The window closed -> the job ended: figures gathered, record written, process group and processes ended,
    the launcher's exit."""
    wall_s: float | None = None
