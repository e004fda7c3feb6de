"""A study's job as a Slurm batch job, and what Slurm says of it: pure functions, no process started.

``--executor slurm`` (``jobs.slurm_executor``) submits each point as a batch job of its own: ``sbatch_argv``
asks for the allocation (``--nodes``, ``--ntasks-per-node``, ``--time`` from ``--timeout``, partition, account,
GPUs per node only when non-zero) and names the job after the attempt's tag, so that a re-run of the study
finds a job still queued or running again (``same_unit``) instead of submitting it twice; ``batch_script``
is what the job runs: one ``srun`` step of ``ds-bench run`` over the whole allocation
(``jobs.launch.srun_command``), the rendezvous address exported from ``--iface`` where no ``--mpi`` plugin
lets rank 0 share it (as ``run_scripts/slurm_multi_node_srun.sbatch`` does).

``parse_fields`` reads ``scontrol show job -o`` (or ``sacct -P``) output; ``SlurmEnd.of`` turns a finished
job's fields into what the study records: Slurm's own state, reason and exit state, and, for an end Slurm
imposed (time limit, cancelled, node failure, preemption, out of memory), the point's status and reason.
States: slurm.schedmd.com/squeue.html#SECTION_JOB-STATE-CODES.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass

ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "REQUEUED",
                    "RESIZING", "SIGNALING", "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
"""States of a job that has not ended (it may still run)."""
IMPOSED = {
    "TIMEOUT": "timeout",
    "OUT_OF_MEMORY": "oom",
    "CANCELLED": "crashed",
    "NODE_FAIL": "crashed",
    "PREEMPTED": "crashed",
    "BOOT_FAIL": "crashed",
    "DEADLINE": "crashed",
    "UNKNOWN": "crashed",
}
"""Ends Slurm imposed on the job, and the point status each gives (a job's own failure is ``FAILED``); ``UNKNOWN``:
Slurm stopped answering about it and ds-bench cancelled it."""
NEVER_STARTS = re.compile(r"^(PartitionNodeLimit|PartitionTimeLimit|BadConstraints|AccountNotAllowed|InvalidAccount|"
                          r"InvalidQOS|PartitionDown|PartitionInactive|(QOS|Assoc)\w*PerJobLimit)")
"""Pending reasons of a job that cannot start as asked (a limit of the partition, QOS or account per job)."""
_TAG_NONCE = re.compile(r"-[0-9a-f]{6}$")


@dataclass(frozen=True)
class Allocation:
    """What each of a study's jobs asks Slurm for (the study's Slurm flags)."""

    nodes: int
    tasks_per_node: int
    time_limit_s: float
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int = 0
    mpi: str | None = None
    """``srun --mpi`` plugin (e.g. ``pmix``): rank 0 then shares its address through it."""
    python: str | None = None
    """The ranks' Python (a study's stack environment, on a file system the nodes share); None: this one."""


def time_limit(seconds: float) -> str:
    """Slurm's ``--time`` in whole minutes, rounded up (its resolution): ``90`` -> ``"2"``."""
    return str(max(1, math.ceil(seconds / 60)))


def unit_of(tag: str) -> str:
    """The unit of work a tag names, without the attempt's nonce (``jobs.runner.new_tag``): the same for a
    re-run's attempt of the same point, so its job is found again."""
    return _TAG_NONCE.sub("", tag)


def same_unit(job_name: str, tag: str) -> bool:
    return unit_of(job_name) == unit_of(tag)


def sbatch_argv(alloc: Allocation, tag: str, log_path: str, workdir: str) -> list[str]:
    """``sbatch --parsable ...`` reading the batch script from stdin (``batch_script``). ``--no-requeue``: a job
    whose node fails ends as ``NODE_FAIL`` (the point's result) instead of running again later unseen; the
    study's re-run decides what runs again (``jobs.ledger``)."""
    argv = ["sbatch", "--parsable", f"--job-name={tag}", f"--nodes={alloc.nodes}",
            f"--ntasks-per-node={alloc.tasks_per_node}", f"--time={time_limit(alloc.time_limit_s)}",
            f"--output={log_path}", "--open-mode=append", f"--chdir={workdir}", "--export=ALL", "--no-requeue"]
    argv += [f"--partition={alloc.partition}"] if alloc.partition else []
    argv += [f"--account={alloc.account}"] if alloc.account else []
    argv += [f"--gpus-per-node={alloc.gpus_per_node}"] if alloc.gpus_per_node else []
    return argv


def batch_script(srun_argv: list[str], iface: str | None, mpi: str | None) -> str:
    """The job's script: one ``srun`` step. Plain srun gives the ranks no channel to share rank 0's address, so
    the script (on the allocation's first node, where rank 0 starts) exports its ``iface`` address."""
    lines = ["#!/bin/bash", "# ds-bench study point (ds_bench.jobs.slurm_batch)"]
    if iface and not mpi:
        lines.append(f"MASTER_ADDR=$(ip -4 -o addr show dev {shlex.quote(iface)} 2>/dev/null | "
                     "awk '{print $4}' | cut -d/ -f1 | head -n 1)")
        lines.append('[ -n "$MASTER_ADDR" ] && export MASTER_ADDR')
    lines.append("exec " + shlex.join(srun_argv))
    return "\n".join(lines) + "\n"


def parse_fields(text: str) -> dict[str, str]:
    """``Key=Value`` words of one ``scontrol show job -o`` line (values without spaces; ``Reason`` may hold
    some, which are kept up to the next ``Key=``)."""
    fields: dict[str, str] = {}
    key = None
    for word in text.split():
        m = re.match(r"^([A-Za-z][A-Za-z0-9_:/]*)=(.*)$", word)
        if m:
            key = m.group(1)
            fields[key] = m.group(2)
        elif key is not None:
            fields[key] += " " + word
    return fields


def parse_sacct(text: str) -> dict[str, str]:
    """The job's line of ``sacct -n -P -X -o JobID,JobName,State,ExitCode,Reason,NodeList`` as scontrol's keys."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) >= 6 and "." not in parts[0]:
            state = parts[2].split()[0] if parts[2] else ""
            return {"JobId": parts[0], "JobName": parts[1], "JobState": state, "ExitCode": parts[3],
                    "Reason": parts[4], "NodeList": parts[5]}
    return {}


@dataclass(frozen=True)
class SlurmEnd:
    """A finished job as Slurm tells it."""

    job_id: str
    state: str
    reason: str | None
    exit_code: int | None
    signal: int | None
    nodes: str | None

    @staticmethod
    def of(job_id: str, fields: dict[str, str]) -> "SlurmEnd":
        code, sig = _exit_state(fields.get("ExitCode", ""))
        reason = fields.get("Reason") or None
        nodes = fields.get("NodeList") or None
        return SlurmEnd(job_id, fields.get("JobState", "UNKNOWN"), None if reason == "None" else reason, code, sig,
                        None if nodes in ("(null)", "None Assigned") else nodes)

    @property
    def imposed(self) -> bool:
        """Slurm ended the job (time limit, cancel, node failure...), not the job's own exit."""
        return self.state in IMPOSED

    @property
    def exit_status(self) -> int | None:
        """The job's exit as a process's would read: the code, or 128 + the signal that ended it."""
        if self.signal:
            return 128 + self.signal
        return self.exit_code

    def to_record(self) -> dict:
        """The record's ``slurm`` block (``record.base_schema.SlurmJob``)."""
        return {"job_id": self.job_id, "state": self.state, "reason": self.reason, "exit_code": self.exit_code,
                "signal": self.signal, "nodes": self.nodes}

    def describe(self) -> str:
        """``Slurm job 12 NODE_FAIL (reason NodeDown) on hosta,hostb, exit 0:9``."""
        reason = f" (reason {self.reason})" if self.reason else ""
        nodes = f" on {self.nodes}" if self.nodes else ""
        exit_state = f", exit {self.exit_code}:{self.signal}" if self.exit_code is not None else ""
        return f"Slurm job {self.job_id} {self.state}{reason}{nodes}{exit_state}"

    def status(self, own: tuple[str, str | None], recorded: bool = True) -> tuple[str, str | None]:
        """The point's (status, reason): ``own`` (``outcome.classify`` of the job) unless Slurm imposed the end,
        which then says what happened first, and what the ranks recorded (``recorded``: they wrote a record)."""
        if not self.imposed:
            return own
        status = IMPOSED[self.state]
        status_own, ranks = own
        said = f"; the ranks recorded: {ranks}" if recorded and ranks and status_own != "ok" else ""
        return status, self.describe() + (said or ("" if recorded else "; no rank recorded anything"))


def slurm_block(slurm: SlurmEnd | None) -> dict:
    """A point record's ``{"slurm": ...}`` for a job Slurm ran, ``{}`` locally: local records stay as they were."""
    return {"slurm": slurm.to_record()} if slurm is not None else {}


def _exit_state(text: str) -> tuple[int | None, int | None]:
    m = re.match(r"^(\d+):(\d+)$", text.strip())
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def never_starts(fields: dict[str, str]) -> str | None:
    """A pending job's reason when it is one that keeps it from ever starting, else None."""
    reason = fields.get("Reason", "")
    return reason if fields.get("JobState") == "PENDING" and NEVER_STARTS.match(reason) else None
