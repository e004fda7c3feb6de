"""The one runner of the studies (sweep, capacity, scaling): each job is a fresh ``ds-bench run`` under the
study's launcher; a study decides what to run next and never imports the run path.

- ``run_argv`` builds the ``ds-bench run`` argv of a job from the study's spec and a ``Layout`` (built here
  only): workload, config, the study's runs file and the attempt's tag, steps, the step watchdog, the
  layout's flags, the memory cap, then the study's own run arguments (``--`` tail) last, so they win;
- ``run_attempt`` launches it (``spawn``: a session of its own, the job's timeout, the whole group stopped
  on a timeout or Ctrl-C), reads back by tag what its ranks recorded (so what a rank recorded on the way
  out of a failure is found as surely as an ``ok``) and classifies the outcome (``outcome.classify``:
  ok, oom, timeout, crashed);
- ``until_interrupted`` runs a study's loop so that Ctrl-C or SIGTERM (Slurm's time limit, ``scancel``) ends
  it between records, says what is kept, and the command exits 130.

A study's spec gives ``workload``, ``runs_path``, ``run_args``, ``timeout_s``, ``master_port`` and the job
(``launcher``, ``nproc``, ``hostfile``, ``iface``: ``ds_bench.jobs.flags``); ``steps``, ``warmup`` and
``cpu_mem_limit`` where it sets them.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Callable, TypeVar

from ds_bench.cluster.rendezvous import free_port
from ds_bench.config.layout import Layout
from ds_bench.jobs import outcome, spawn
from ds_bench.record import store
from ds_bench.record.schema import RunRecord

T = TypeVar("T")
INTERRUPTED = 130
"""A study's exit status when interrupted (128 + SIGINT)."""


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
    runs: tuple[RunRecord, ...] = ()
    """Every run record the job's ranks wrote."""


def slug(key: str) -> str:
    """A point or layout key as a file-name part."""
    return re.sub(r"[^A-Za-z0-9]+", "_", key.replace("=", "")).strip("_")


def new_tag(prefix: str, key: str, repeat: int = 0) -> str:
    return f"{prefix}-{slug(key)}-r{repeat}-{uuid.uuid4().hex[:6]}"


def run_argv(spec, tag: str, config: str, layout: Layout | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """``ds-bench run`` with everything one job of the study sets, then ``extra`` (what this job alone
    adds, e.g. a capacity member's shape) and the study's run arguments."""
    argv = ["run", "--workload", spec.workload, "--ds-config", config, "--results", spec.runs_path, "--tag", tag]
    if getattr(spec, "steps", None) is not None:
        argv += ["--steps", str(spec.steps), "--warmup", str(spec.warmup)]
    argv += ["--step-timeout", f"{spec.timeout_s:g}"]
    if layout is not None:
        argv += ["--engine", layout.engine, *layout.run_flags()]
    if getattr(spec, "cpu_mem_limit", None):
        argv += ["--cpu-mem-limit", str(spec.cpu_mem_limit)]
    return [*argv, *extra, *spec.run_args]


def run_attempt(spec, run_args: list[str], tag: str, log_path: str, job=None, env: dict | None = None) -> Attempt:
    """Launch ``run_args`` (from ``run_argv``) on ``job``'s ranks (default: the spec's), wait at most
    ``spec.timeout_s``, and read back what its ranks recorded. ``env``: the job's whole environment."""
    argv = spawn.command(job or spec, run_args, free_port(spec.master_port))
    probe = outcome.BusyProbe.start_now()
    end = spawn.run_job(argv, log_path, spec.timeout_s, env=env)
    busy = probe.finish()
    runs = [r for r in store.read_records(spec.runs_path, RunRecord, missing_ok=True) if r.tag == tag]
    status, reason = outcome.classify(runs, end.exit_code, end.timed_out, spec.timeout_s)
    chosen = next((r for r in runs if r.status == "ok"), runs[0] if runs else None)
    return Attempt(status, reason, chosen, end, busy, log_path, tuple(runs))


def until_interrupted(loop: Callable[[], T], kept: Callable[[], str]) -> tuple[bool, T | None]:
    """``(True, loop())``, or ``(False, None)`` after Ctrl-C / SIGTERM, having printed ``kept()``: what the
    interrupted study kept and how to go on (the running job is stopped whole by ``spawn.run_job``)."""
    spawn.sigterm_as_interrupt()
    try:
        return True, loop()
    except KeyboardInterrupt:
        print(f"\n{kept()}", flush=True)
        return False, None
