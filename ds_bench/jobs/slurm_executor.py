"""The one place a study talks to Slurm (``--executor slurm``): submit a point as a batch job, find a job
still queued or running from an earlier run of the study again, wait for its end, cancel what this
process submitted.

``run`` is ``spawn.run_job``'s counterpart: it returns when the job has ended, with Slurm's own account of
the end (``slurm_batch.SlurmEnd``) read from ``scontrol show job`` (kept ``MinJobAge`` seconds after the end)
or, once Slurm has forgotten the job, ``sacct``. A job found again must be of the same point and the same
study (its log in this study's folder). Every wait is bounded and past its bound the job is cancelled: a
queued job by ``queue_timeout_s`` (one Slurm says can never start as asked is the study's bad input at once),
a running one by its time limit plus Slurm's grace (``RUN_GRACE_S``), a job Slurm gives no answer about by
``UNANSWERED_S``. Ctrl-C or SIGTERM (``cancel_all``) cancels (``scancel``) every job this
process submitted and still waits on, and each waiting thread then raises ``KeyboardInterrupt``: a
cancelled point records nothing, so the study's re-run submits it again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from ds_bench.errors import UserError
from ds_bench.jobs import launch, slurm_batch, spawn
from ds_bench.jobs.slurm_batch import Allocation, SlurmEnd

CLIENT_TIMEOUT_S = 60.0
"""sbatch, scontrol, squeue, scancel, sacct: a controller that does not answer within this is down."""
UNANSWERED_S = 300.0
"""How long Slurm may give no answer about a job (scontrol and sacct both failing) before it is cancelled."""
RUN_GRACE_S = 180.0
"""Beyond the job's time limit before this process gives up on it: Slurm's KillWait and OverTimeLimit."""
POLL_S = (0.5, 5.0)
"""Seconds between looks at a job: from the first, growing 1.5x to the second."""

_active: dict[str, str] = {}
"""Job id -> tag of the jobs this process waits on (what ``cancel_all`` cancels)."""
_active_lock = threading.Lock()
_stop = threading.Event()


@dataclass(frozen=True)
class Waited:
    """A job's end as this process saw it."""

    slurm: SlurmEnd
    tag: str
    """The tag its ranks record under (an earlier run's, when the job was found again)."""
    log: str
    started_at: float
    ended_at: float
    timed_out: bool
    """This process gave up on it (queued or running past its bounds) and cancelled it."""
    found_again: bool


def srun_argv(alloc: Allocation, run_args: list[str], iface: str | None) -> list[str]:
    return launch.srun_command(spawn.with_iface(run_args, iface), nnodes=alloc.nodes, tasks_per_node=alloc.tasks_per_node,
                               python=alloc.python or sys.executable, mpi=alloc.mpi, gpus_per_node=alloc.gpus_per_node)


def run(alloc: Allocation, run_args: list[str], iface: str | None, tag: str, log_path: str,
        env: dict[str, str] | None, queue_timeout_s: float) -> Waited:
    """Submit the job (or find the same unit's job again) and wait for its end."""
    if _stop.is_set():  # interrupted while this thread was between jobs
        raise KeyboardInterrupt
    found = find_again(tag, log_path, env)
    if found is not None:
        job_id, tag, log_path = found
        print(f"  found Slurm job {job_id} ({tag}) of an earlier run of this study: taking its result", flush=True)
    else:
        job_id = submit(alloc, run_args, iface, tag, log_path, env)
    with _active_lock:
        _active[job_id] = tag
    try:
        fields, timed_out, seen = _wait(job_id, env, alloc.time_limit_s, queue_timeout_s)
    except KeyboardInterrupt:
        cancel_all()
        raise
    finally:
        with _active_lock:
            _active.pop(job_id, None)
    started = _epoch(fields.get("StartTime")) or seen[0]  # a job that never ran has none: the times seen here
    ended = _epoch(fields.get("EndTime")) or seen[1]
    return Waited(SlurmEnd.of(job_id, fields), tag, log_path, started, ended, timed_out, found is not None)


def submit(alloc: Allocation, run_args: list[str], iface: str | None, tag: str, log_path: str,
           env: dict[str, str] | None) -> str:
    """``sbatch --parsable``; the job id. A refusal (bad partition, account, limits) is the study's bad input."""
    script = slurm_batch.batch_script(srun_argv(alloc, run_args, iface), iface, alloc.mpi)
    argv = slurm_batch.sbatch_argv(alloc, tag, os.path.abspath(log_path), os.getcwd())
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write("$ " + " ".join(argv) + "\n" + script)
    proc = _client(argv, _submit_env(env), stdin=script)
    if proc.returncode != 0:
        raise UserError(f"sbatch refused the job: {_last_line(proc.stderr) or f'exit {proc.returncode}'}")
    return proc.stdout.strip().split(";")[0]


def _submit_env(env: dict[str, str] | None) -> dict[str, str]:
    """The job's environment (``--export=ALL``) without the ``SLURM_*`` of an allocation the study itself may run
    in: they would reach the job's srun step (``SLURM_CONF`` stays: it says which cluster)."""
    base = os.environ if env is None else env
    return {k: v for k, v in base.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def sinfo(*options: str) -> str:
    """``sinfo -h OPTIONS``' output; a UserError when no controller answers (or Slurm is not installed here)."""
    proc = _client(["sinfo", "-h", *options], None)
    if proc.returncode != 0:
        raise UserError(f"--executor slurm: no Slurm controller answers here (sinfo: "
                        f"{_last_line(proc.stderr) or f'exit {proc.returncode}'})")
    return proc.stdout


def check_cluster(partition: str | None) -> None:
    """Before a study starts: Slurm's commands answer, and ``--partition`` is one of the cluster's."""
    known = [p.rstrip("*") for p in sinfo("-o", "%P").split()]
    for one in (partition or "").split(","):  # sbatch takes a list: the first that can run the job
        if one and one not in known:
            raise UserError(f"--partition {partition}: {one} is not a partition of this cluster; it has "
                            f"{', '.join(known)}")


def find_again(tag: str, log_path: str, env: dict[str, str] | None) -> tuple[str, str, str] | None:
    """(job id, its tag, its log) of this user's job of the same unit *and the same study* (its log in this
    study's folder beside ``--results``) that is queued or running, or else one that completed while no study
    waited on it (a killed study's), or None. Slurm lists ended jobs for ``MinJobAge``."""
    proc = _client(["squeue", "--me", "-h", "-t", "all", "-o", "%i|%j|%T"], env)
    if proc.returncode != 0:
        return None
    mine = [(job_id, name, state) for job_id, name, state in
            ((line.split("|") + ["", "", ""])[:3] for line in proc.stdout.splitlines())
            if slurm_batch.same_unit(name, tag) and job_id.isdigit()]
    folder = os.path.dirname(os.path.abspath(log_path))
    for wanted in (slurm_batch.ACTIVE, {"COMPLETED"}):
        for _, job_id, name in sorted(((int(i), i, n) for i, n, state in mine if state in wanted), reverse=True):
            log = job_fields(job_id, env).get("StdOut", "")
            if os.path.dirname(log) == folder:
                return job_id, name, log
    return None


def job_fields(job_id: str, env: dict[str, str] | None) -> dict[str, str]:
    """The job as ``scontrol show job`` tells it, else ``sacct``; ``{}`` when neither knows it."""
    proc = _client(["scontrol", "show", "job", "-o", job_id], env)
    if proc.returncode == 0 and "JobState=" in proc.stdout:
        return slurm_batch.parse_fields(proc.stdout.splitlines()[0])
    proc = _client(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "JobID,JobName,State,ExitCode,Reason,NodeList"],
                   env)
    return slurm_batch.parse_sacct(proc.stdout) if proc.returncode == 0 else {}


def cancel_all() -> None:
    """Ctrl-C / SIGTERM: ``scancel`` every job this process waits on; the waiting threads raise."""
    _stop.set()
    with _active_lock:
        ids = list(_active)
    if ids:
        _client(["scancel", *ids], None)
        print(f"cancelled Slurm job(s) {', '.join(ids)}", flush=True)


def reset() -> None:
    """A new study in this process (tests): forget an earlier interrupt."""
    _stop.clear()


def _wait(job_id: str, env, time_limit_s: float, queue_timeout_s: float) -> tuple[dict[str, str], bool, tuple]:
    """(the ended job's fields, whether this process gave up on it, (seen start, seen end) in Unix time).
    Raises ``UserError`` (after cancelling it) for a job Slurm says can never start as asked."""
    submitted, running_since, delay, seen_start = time.monotonic(), None, POLL_S[0], time.time()
    last_answer = submitted
    while True:
        if _stop.is_set():
            raise KeyboardInterrupt
        fields = job_fields(job_id, env)
        state = fields.get("JobState")
        now = time.monotonic()
        if not fields:
            if now - last_answer > UNANSWERED_S:
                _client(["scancel", job_id], env)
                return {"JobState": "UNKNOWN", "Reason": f"no answer from Slurm about it for {UNANSWERED_S:g} s; "
                                                         "cancelled"}, False, (seen_start, time.time())
        elif state not in slurm_batch.ACTIVE:
            return fields, False, (seen_start, time.time())
        elif state == "PENDING":
            last_answer = now
            _refuse_if_never_starts(job_id, fields, env)
            if now - submitted > queue_timeout_s:
                _client(["scancel", job_id], env)
                reason = f"still queued after {queue_timeout_s:g} s (--queue-timeout); cancelled"
                return {"JobState": "CANCELLED", "Reason": reason}, False, (seen_start, time.time())
        else:
            last_answer = now
            if running_since is None:
                running_since, seen_start = now, time.time()
            elif now - running_since > time_limit_s + RUN_GRACE_S:
                _client(["scancel", job_id], env)
                reason = f"still running {RUN_GRACE_S:g} s past its time limit; cancelled by ds-bench"
                return {**fields, "JobState": "TIMEOUT", "Reason": reason}, True, (seen_start, time.time())
        _stop.wait(delay)
        delay = min(delay * 1.5, POLL_S[1])


def _refuse_if_never_starts(job_id: str, fields: dict[str, str], env) -> None:
    why = slurm_batch.never_starts(fields)
    if why:
        _client(["scancel", job_id], env)
        raise UserError(f"Slurm job {job_id} can never start as asked ({why}): check --timeout (its --time), "
                        "--nodes, --nproc, --gpus-per-node, --partition and --account against the partition's limits")


def _client(argv: list[str], env: dict[str, str] | None, stdin: str | None = None) -> subprocess.CompletedProcess:
    try:
        # a session of its own: Ctrl-C at the terminal must not kill the scancel that follows it
        return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S, env=env,
                              start_new_session=True)
    except FileNotFoundError:
        raise UserError(f"--executor slurm: `{argv[0]}` not found: run the study where Slurm's commands are "
                        "(a login node)") from None
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 1, "", f"{argv[0]}: no answer in {CLIENT_TIMEOUT_S:g} s")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _epoch(text: str | None) -> float | None:
    """``2026-11-26T05:09:51`` (Slurm's local time) as Unix time; None for ``Unknown``/``None``."""
    try:
        return time.mktime(time.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None

