"""The one place a sweep (and ``ds-bench scaling``) starts and stops processes: each point is a fresh
job under a launcher.

``command`` (pure) builds the job's argv with the builders ``ds-bench launch`` uses: on this node
``torchrun --nproc_per_node N ... -m ds_bench run ...`` (a study's default; or ``deepspeed --num_gpus N
--master_port P --module ds_bench run ...``); with a hostfile, the deepspeed launcher or Open MPI's ``mpirun``; inside a
Slurm allocation, ``srun``. ``run_job`` starts it in a
session of its own (its output to the point's log file, never the terminal), waits at most the
point's timeout, and on a timeout or an interrupt stops the whole process group: SIGTERM (the ranks
record why they stop), then SIGKILL after ``GRACE_S``; a second Ctrl-C kills at once. It returns
only when no process of the job is left, so the next point starts on a free device.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

GRACE_S = 15.0
GONE_WAIT_S = 30.0


@dataclass(frozen=True)
class JobEnd:
    exit_code: int | None
    timed_out: bool
    started_at: float
    ended_at: float


def command(spec, run_args: list[str], port: int, python: str | None = None) -> list[str]:
    """``spec``: the job (``launcher``, ``nproc``, ``hostfile``, optionally ``iface``: every rank meets on it;
    under mpirun Open MPI's own traffic too; optionally ``python``: the ranks' interpreter, a study's stack
    environment's, whose launchers start them); ``python``: the study's, where ``spec`` is a job of its own."""
    from ds_bench.jobs import launch

    iface = getattr(spec, "iface", None)
    python = python or getattr(spec, "python", None) or sys.executable
    if spec.launcher == "srun" or (spec.launcher == "deepspeed" and not spec.hostfile):
        run_args = with_iface(run_args, iface)
    if spec.launcher == "deepspeed" and not spec.hostfile:
        return [beside_python("deepspeed", python), "--num_gpus", str(spec.nproc), "--master_port", str(port), "--module",
                "ds_bench", *run_args]
    if spec.launcher == "srun":
        nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
        return launch.srun_command(run_args, nnodes=nodes, tasks_per_node=spec.nproc, python=python)
    argv = launch.build(launch.LaunchSpec(spec.launcher, tuple(run_args), hostfile=spec.hostfile,
                                          nproc_per_node=spec.nproc, master_port=port, iface=iface, python=python))
    return [beside_python(argv[0], python), *argv[1:]] if argv[0] in ("deepspeed", "torchrun") else argv


def job_environment(spec, env: dict[str, str] | None, python: str | None = None) -> dict[str, str] | None:
    """The job's environment (``env``, else this process's; None: unchanged): under torchrun, each rank's
    ``OMP_NUM_THREADS`` is its share of this node's cores (``rank_threads``) unless the user set it; with another
    environment's ``python`` (a study's stack), ``PYTHONPATH`` leads with this ds_bench's folder, so the job runs the
    study's own harness code whatever that environment's ``.pth`` names (``machine.stack_envs``)."""
    base = os.environ if env is None else env
    out = None
    threads = rank_threads(base, spec.launcher, len(os.sched_getaffinity(0)), spec.nproc)
    if threads is not None:
        out = {**base, "OMP_NUM_THREADS": threads}
    if python and os.path.abspath(python) != os.path.abspath(sys.executable):  # a venv's python links to the same binary
        here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = dict(out or base)
        out["PYTHONPATH"] = os.pathsep.join(filter(None, (here, out.get("PYTHONPATH"))))
    return env if out is None else out


def rank_threads(environ, launcher: str, cores: int, ranks_per_node: int) -> str | None:
    """``OMP_NUM_THREADS`` for a torchrun job's ranks (pure): cores // ranks, at least 1; None when set already or
    under another launcher. torchrun alone sets 1 for every rank of a multi-rank job, whatever the cores, where the
    deepspeed launcher sets none (ds_bench's CPU ranks then take cores // ranks themselves:
    ``cluster.process_group._limit_cpu_threads``): 1 would starve CPU ranks and ZeRO-Offload's OpenMP CPU Adam on a
    many-core node, and make a study's figures depend on its launcher."""
    if launcher != "torchrun" or "OMP_NUM_THREADS" in environ:
        return None
    return str(threads_per_rank(cores, ranks_per_node))


def threads_per_rank(cores: int, ranks_per_node: int) -> int:
    """Torch threads each CPU rank of a node gets: the cores shared by its ranks, at least 1 (pure; a scaling
    study takes it for the ranks of its largest point, so 1 rank and N ranks run the same "device")."""
    return max(1, cores // max(1, ranks_per_node))


def with_iface(run_args: list[str], iface: str | None) -> list[str]:
    """``run ...`` with ``--iface IFACE`` after the command word, where the ranks choose their own rendezvous
    interface (no launcher passes it on); unchanged without one."""
    return [*run_args[:1], "--iface", iface, *run_args[1:]] if iface else run_args


def world_of(spec) -> tuple[int, int]:
    """(world size, ranks per node) of every point."""
    if getattr(spec, "slurm", None) is not None:  # each job its own allocation of --nodes
        return spec.slurm.nodes * spec.nproc, spec.nproc
    if spec.hostfile:
        from ds_bench.cluster.hostfile import load_hostfile, world_info

        slots = load_hostfile(spec.hostfile)
        _, world = world_info(slots)
        return world, max(len(s) for s in slots.values())
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1")) if spec.launcher == "srun" else 1
    return spec.nproc * nodes, spec.nproc


def beside_python(launcher: str, python: str | None = None) -> str:
    """The launcher of ``python``'s environment (default this one's; its bin folder need not be on PATH), else by
    name."""
    beside = os.path.join(os.path.dirname(python or sys.executable), launcher)
    return beside if os.path.exists(beside) else launcher


def run_job(argv: list[str], log_path: str, timeout_s: float, env: dict[str, str] | None = None) -> JobEnd:
    """``env``: the job's whole environment (default: this process's)."""
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        started = time.time()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        try:
            code, timed_out = proc.wait(timeout=timeout_s), False
        except subprocess.TimeoutExpired:
            code, timed_out = stop(proc), True
        except BaseException:  # Ctrl-C / SIGTERM to the sweep: clean up the running point, then go
            with _second_interrupt_kills(proc.pid):
                stop(proc)
            raise
        wait_gone(proc.pid)
    return JobEnd(code, timed_out, started, time.time())


def stop(proc: subprocess.Popen) -> int | None:
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        return proc.wait(timeout=GRACE_S)
    finally:
        wait_gone(proc.pid)


def wait_gone(pgid: int, timeout_s: float = GONE_WAIT_S) -> None:
    """Until no process of the job's group is left (SIGKILL to stragglers after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while _group_alive(pgid):
        if time.monotonic() > deadline:
            _signal_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + timeout_s
        time.sleep(0.1)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    import psutil

    # zombies of an exited launcher count as gone
    return any(p.info["status"] != psutil.STATUS_ZOMBIE for p in psutil.process_iter(["status"])
               if _pgid(p.pid) == pgid)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class _second_interrupt_kills:
    """While the running point is being stopped, a second Ctrl-C kills it and ends the sweep at once."""

    def __init__(self, pgid: int):
        self.pgid = pgid

    def __enter__(self):
        def kill_now(signum, _frame):
            _signal_group(self.pgid, signal.SIGKILL)
            os._exit(128 + signum)

        self.previous = {s: signal.signal(s, kill_now) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc):
        for s, h in self.previous.items():
            signal.signal(s, h)


def sigterm_as_interrupt() -> None:
    """Slurm's time limit and ``scancel`` stop a sweep the way Ctrl-C does."""
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
