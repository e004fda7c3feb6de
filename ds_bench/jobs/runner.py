"""The one runner of the studies (sweep, capacity, scaling): each job is a fresh ``ds-bench run`` under the
study's launcher; a study decides what to run next and never imports the run path.

- ``run_argv`` builds the ``ds-bench run`` argv of a job from the study's spec and a ``Layout`` (built here
  only): workload, config, the study's runs file and the attempt's tag, steps, the step watchdog, the
  layout's flags, the memory cap, then the study's own run arguments (``--`` tail) last, so they win;
- ``run_attempt`` launches it (``spawn``: a session of its own, the job's timeout, the whole group stopped
  on a timeout or Ctrl-C), reads back by tag what its ranks recorded (so what a rank recorded on the way
  out of a failure is found as surely as an ``ok``) and classifies the outcome (``outcome.classify``:
  ok, oom, timeout, crashed);
- with ``--executor slurm`` (``spec.slurm``), ``run_attempt`` submits the job as a Slurm batch job of its own
  instead (``slurm_executor``: found again if an earlier run of the study left it queued or running) and
  reads Slurm's account of its end beside the ranks' records (``slurm_batch.SlurmEnd.status``);
- ``run_concurrently`` runs a study's independent parts (a sweep's families, a capacity search's layouts,
  scaling's points) at once under Slurm, one after another locally. Study code runs one thread at a time (the
  ``_turn``), so a study's state needs no locks of its own; a thread lets go of its turn only while its job
  runs. Ctrl-C cancels every job submitted (``scancel``) and nothing of them is recorded;
- ``until_interrupted`` runs a study's loop so that Ctrl-C or SIGTERM (Slurm's time limit, ``scancel``) ends
  it between records, says what is kept, and the command exits 130.

A study's spec gives ``workload``, ``runs_path``, ``run_args``, ``timeout_s``, ``master_port`` and the job
(``launcher``, ``nproc``, ``hostfile``, ``iface``: ``ds_bench.config.study_flags``); ``steps``, ``warmup`` and
``cpu_mem_limit`` where it sets them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Callable, TypeVar

from ds_bench.cluster.rendezvous import free_port
from ds_bench.config.layout import Layout
from ds_bench.config.parsers import duration_text
from ds_bench.jobs import outcome, slurm_executor, spawn
from ds_bench.jobs.slurm_batch import Allocation, SlurmEnd
from ds_bench.machine import oom_kills
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
    busy: dict | None
    """Other work on the machine meanwhile (``outcome.BusyProbe``); None for a Slurm job (it ran elsewhere)."""
    log: str
    runs: tuple[RunRecord, ...] = ()
    """Every run record the job's ranks wrote."""
    tag: str | None = None
    """The tag the ranks recorded under (an earlier attempt's, for a Slurm job found again)."""
    slurm: SlurmEnd | None = None
    """``--executor slurm``: Slurm's account of the job's end."""


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
    argv += ["--step-timeout", duration_text(spec.timeout_s)]
    if layout is not None:
        argv += ["--engine", layout.engine, *layout.run_flags()]
    if getattr(spec, "cpu_mem_limit", None):
        argv += ["--cpu-mem-limit", f"{spec.cpu_mem_limit}B"]  # with its unit: a bare number is refused
    return [*argv, *extra, *spec.run_args]


def run_attempt(spec, run_args: list[str], tag: str, log_path: str, job=None, env: dict | None = None) -> Attempt:
    """Launch ``run_args`` (from ``run_argv``) on ``job``'s ranks (default: the spec's), wait at most
    ``spec.timeout_s``, and read back what its ranks recorded. ``env``: the job's whole environment."""
    if getattr(spec, "slurm", None) is not None:
        return _slurm_attempt(spec, run_args, tag, log_path, job or spec, env)
    argv = spawn.command(job or spec, run_args, free_port(spec.master_port), getattr(spec, "python", None))
    probe, kills_before = outcome.BusyProbe.start_now(), oom_kills.read_counts()
    with _turn.released():
        env = spawn.job_environment(job or spec, env, getattr(spec, "python", None))
        end = spawn.run_job(argv, log_path, spec.timeout_s, env=env)
    busy = probe.finish()
    runs = _runs_of(spec, tag)
    kills = oom_kills.read_counts().kills_since(kills_before)  # the job's cgroup is this one's
    status, reason = outcome.classify(runs, end.exit_code, end.timed_out, spec.timeout_s, kills or 0)
    return Attempt(status, reason, _chosen(runs), end, busy, log_path, tuple(runs), tag)


def _slurm_attempt(spec, run_args: list[str], tag: str, log_path: str, job, env: dict | None) -> Attempt:
    """The job as a Slurm batch job: its allocation from the spec's Slurm flags and the job's ranks per node
    (and, for scaling, its own node count); no busy probe (it runs elsewhere)."""
    alloc = _allocation(spec, job)
    with _turn.released():
        waited = slurm_executor.run(alloc, run_args, spec.iface, tag, log_path, env, spec.slurm.queue_timeout_s)
    runs = _runs_of(spec, waited.tag)
    own = outcome.classify(runs, waited.slurm.exit_status, waited.timed_out, spec.timeout_s)
    status, reason = waited.slurm.status(own, recorded=bool(runs))
    end = spawn.JobEnd(waited.slurm.exit_status, waited.timed_out, waited.started_at, waited.ended_at)
    return Attempt(status, reason, _chosen(runs), end, None, waited.log, tuple(runs), waited.tag, waited.slurm)


def _allocation(spec, job) -> Allocation:
    opts = spec.slurm
    return Allocation(nodes=getattr(job, "nodes", None) or opts.nodes, tasks_per_node=job.nproc,
                      time_limit_s=spec.timeout_s, partition=opts.partition, account=opts.account,
                      gpus_per_node=opts.gpus_per_node, mpi=opts.mpi, python=getattr(spec, "python", None))


def command_line(spec, run_args: list[str], job=None) -> list[str]:
    """What ``run_attempt`` starts for ``run_args`` (``--dry-run``): the launcher's argv; under Slurm the sbatch
    line, then (after ``<<<``) the srun step its batch script runs."""
    if getattr(spec, "slurm", None) is None:
        return spawn.command(job or spec, run_args, free_port(spec.master_port), getattr(spec, "python", None))
    from ds_bench.jobs.slurm_batch import sbatch_argv

    alloc = _allocation(spec, job or spec)
    tag = run_args[run_args.index("--tag") + 1] if "--tag" in run_args else "<tag>"
    return [*sbatch_argv(alloc, tag, "<log>", "."), "<<<", *slurm_executor.srun_argv(alloc, run_args, spec.iface)]


def _runs_of(spec, tag: str) -> list[RunRecord]:
    return [r for r in store.read_records(spec.runs_path, RunRecord, missing_ok=True) if r.tag == tag]


def _chosen(runs: list[RunRecord]) -> RunRecord | None:
    return next((r for r in runs if r.status == "ok"), runs[0] if runs else None)


class _Turn:
    """Study code runs in one thread at a time; ``released`` lets go while this thread's job runs."""

    def __init__(self):
        self._lock = threading.Lock()
        self._local = threading.local()

    @contextlib.contextmanager
    def held(self):
        with self._lock:
            self._local.held = True
            try:
                yield
            finally:
                self._local.held = False

    @contextlib.contextmanager
    def released(self):
        if not getattr(self._local, "held", False):
            yield
            return
        self._local.held = False
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            self._local.held = True


_turn = _Turn()


def executor_line(spec, parts: int, what: str) -> str | None:
    """``--dry-run``'s line on how the study's jobs run under Slurm (None locally): the sbatch line and step of one
    job (``<tag>``, ``<config>`` standing for each job's own) and how many run at once."""
    if getattr(spec, "slurm", None) is None:
        return None
    example = command_line(spec, run_argv(spec, "<tag>", "<config>"))
    return f"each {what} a Slurm job, up to {workers(spec, parts)} at once: " + " ".join(example)


def check_cluster(spec) -> None:
    """Under ``--executor slurm``: Slurm answers and has ``--partition`` (the study's last check before it runs)."""
    if getattr(spec, "slurm", None) is not None:
        slurm_executor.check_cluster(spec.slurm.partition)


def workers(spec, parts: int) -> int:
    """How many of a study's independent parts run at once: one locally; under Slurm ``--max-jobs`` (default
    all of them)."""
    opts = getattr(spec, "slurm", None)
    return 1 if opts is None else max(1, min(parts, opts.max_jobs or parts))


def run_concurrently(parts: list[Callable[[], T]], n_workers: int) -> list[T]:
    """``[part() for part in parts]``, up to ``n_workers`` at once (threads taking turns, see ``_Turn``). The first
    exception (Ctrl-C included) cancels the Slurm jobs still running and is raised once every thread is done."""
    if n_workers <= 1 or len(parts) <= 1:
        return [part() for part in parts]
    slurm_executor.reset()

    def in_turn(part):
        with _turn.held():
            return part()

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="study")
    futures = [pool.submit(in_turn, part) for part in parts]
    try:
        while True:
            done, pending = concurrent.futures.wait(futures, timeout=0.5, return_when="FIRST_EXCEPTION")
            failed = [f for f in done if f.exception() is not None]
            if failed:
                raise failed[0].exception()
            if not pending:
                return [f.result() for f in futures]
    except BaseException:
        slurm_executor.cancel_all()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=False)


def until_interrupted(loop: Callable[[], T], kept: Callable[[], str]) -> tuple[bool, T | None]:
    """``(True, loop())``, or ``(False, None)`` after Ctrl-C / SIGTERM, having printed ``kept()``: what the
    interrupted study kept and how to go on (the running job is stopped whole by ``spawn.run_job``)."""
    spawn.sigterm_as_interrupt()
    try:
        return True, loop()
    except KeyboardInterrupt:
        print(f"\n{kept()}", flush=True)
        return False, None
