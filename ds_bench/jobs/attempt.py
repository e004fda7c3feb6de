"""One attempt of a job that runs ``ds-bench run``, as the sweep and the capacity search launch it: a
fresh job under the spec's launcher, its run records read back by tag, its outcome classified.

The job's ranks append their records to the spec's ``runs_path`` with a tag unique to the attempt
(``new_tag``), so what a rank recorded on the way out of a failure is found as surely as an ``ok``.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from ds_bench.cluster.rendezvous import free_port
from ds_bench.jobs import outcome, spawn
from ds_bench.record import store
from ds_bench.record.schema import RunRecord


@dataclass(frozen=True)
class Attempt:
    status: str
    """``ok``, ``oom``, ``timeout`` or ``crashed`` (``outcome.classify``)."""
    reason: str | None
    run: RunRecord | None
    """The run record that speaks for the attempt: an ``ok`` one, else the first failed one."""
    job: spawn.JobEnd
    busy: dict
    """Other work on the machine meanwhile (``outcome.BusyProbe``)."""
    log: str


def slug(key: str) -> str:
    """A point or layout key as a file-name part."""
    return re.sub(r"[^A-Za-z0-9]+", "_", key.replace("=", "")).strip("_")


def new_tag(prefix: str, key: str, repeat: int = 0) -> str:
    return f"{prefix}-{slug(key)}-r{repeat}-{uuid.uuid4().hex[:6]}"


def run_attempt(spec, run_args: list[str], tag: str, log_path: str) -> Attempt:
    """Launch ``run_args`` (a ``ds-bench run`` command carrying ``--tag tag --results spec.runs_path``)
    on the spec's ranks, wait at most ``spec.timeout_s``, and read back what its ranks recorded."""
    argv = spawn.command(spec, run_args, free_port(spec.master_port))
    probe = outcome.BusyProbe.start_now()
    end = spawn.run_job(argv, log_path, spec.timeout_s)
    busy = probe.finish()
    runs = [r for r in store.read_records(spec.runs_path, RunRecord, missing_ok=True) if r.tag == tag]
    status, reason = outcome.classify(runs, end.exit_code, end.timed_out, spec.timeout_s)
    chosen = next((r for r in runs if r.status == "ok"), runs[0] if runs else None)
    return Attempt(status, reason, chosen, end, busy, log_path)
