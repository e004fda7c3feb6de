"""The studies' shared flags, each defined once: the job flags (where and how each job runs, where the
study records, how long a job may take), the parallel-degree axes (one per ``config.layout.DEGREES``) and the
memory-option axes (one per ``config.layout.SWITCHES``).

``ds-bench sweep``, ``bench``, ``capacity`` and ``scaling`` add them with ``add_job_arguments``,
``add_degree_arguments`` and ``add_switch_arguments`` and read them back, checked, with ``job_options``,
``degrees_of`` and ``switches_of``; a new parallel degree in ``DEGREES`` or switch in ``SWITCHES`` is a new axis
flag of every study that adds them, with no edit here. ``run_flags_of`` parses the ``run`` flags a study gives
every job, for the checks and predictions that need the model they build (``Workload.check_study``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from ds_bench.config import argcheck
from ds_bench.config.layout import DEGREES, SWITCHES
from ds_bench.config.parsers import parse_duration, parse_list
from ds_bench.config.run_flags import add_iface_argument, parse_run_tail
from ds_bench.errors import UserError

LAUNCHERS = ("deepspeed", "torchrun", "mpirun", "srun")
"""Every launcher ds_bench builds a command for; ``ds-bench launch``'s choices and the studies' ``--launcher``,
the first their default."""


EXECUTORS = ("local", "slurm")


@dataclass(frozen=True)
class SlurmOptions:
    """What each job of a study run with ``--executor slurm`` asks Slurm for, beyond its ranks per node."""

    nodes: int
    """Nodes of each job (scaling: each point's own count)."""
    partition: str | None
    account: str | None
    gpus_per_node: int
    mpi: str | None
    max_jobs: int | None
    """Jobs of the study queued or running at once (None: every independent point at once)."""
    queue_timeout_s: float


@dataclass(frozen=True)
class StudySpec:
    """What every study's spec has (sweep, capacity and scaling derive theirs from it): the job flags, as
    ``job_options`` checks them, and where the study writes beside its results file."""

    results: str
    """The study's records, JSON lines; also its state (``jobs.ledger``)."""
    launcher: str
    hostfile: str | None
    iface: str | None
    master_port: int
    timeout_s: float
    """Wall-clock limit of one job; also its ``ds-bench run --step-timeout`` (and, under Slurm, its ``--time``)."""
    slurm: SlurmOptions | None
    """``--executor slurm``: each job a Slurm batch job of its own (``jobs.slurm_executor``); None: local."""

    @property
    def runs_path(self) -> str:
        """Every job's full run records (the study's records name them by tag and run id)."""
        return self.output_path(".runs.jsonl")

    def output_path(self, suffix: str) -> str:
        return os.path.splitext(self.results)[0] + suffix


def add_job_arguments(p: argparse.ArgumentParser, *, results: str, master_port: int, nproc: bool = True,
                      nodes: bool = True, gpus_help: str | None = None) -> None:
    """``--results --launcher --hostfile [--nproc] --iface --master-port --timeout --dry-run`` and the Slurm
    executor's flags (``add_slurm_arguments``; ``nodes``: with ``--nodes``, the jobs' nodes; ``gpus_help``: what
    ``--gpus-per-node`` also is to a command that reads it beyond Slurm)."""
    p.add_argument("--results", default=results, help=f"the study's records, JSON lines; also its state (default "
                                                      f"{results})")
    p.add_argument("--launcher", default=None, choices=LAUNCHERS,
                   help="torchrun (default on this node) or deepspeed; with --hostfile: deepspeed (default) or "
                        "mpirun; srun inside a Slurm allocation")
    p.add_argument("--hostfile", default=None, help="DeepSpeed hostfile ('host slots=N' lines) for a multi-node study")
    if nproc:
        p.add_argument("--nproc", type=int, default=None, help="ranks per node (default: all GPUs; on CPU 2)")
    add_iface_argument(p)
    p.add_argument("--master-port", type=int, default=master_port,
                   help=f"preferred rendezvous port; a free one from it is taken per job (default {master_port})")
    p.add_argument("--timeout", default="15m", metavar="DURATION",
                   help="wall-clock limit per job with its unit: 90s, 15m, 1h (default 15m; under Slurm also the job's "
                        "--time, rounded up to whole minutes)")
    p.add_argument("--dry-run", action="store_true", help="print what would run, run nothing")
    p.add_argument("--compute-node", default=None, metavar="KEY=VALUE,...",
                   help="the nodes the jobs run on, where this machine or Slurm's node records do not say it right: "
                        "gpus=N, gpu=H100, gpu-memory=80GiB, bf16=native|emulated, cpus=N, memory=512GiB (default: "
                        "this machine; under --executor slurm the partition's node records)")
    add_slurm_arguments(p, nodes=nodes, gpus_help=gpus_help)


def add_slurm_arguments(p: argparse.ArgumentParser, nodes: bool = True, gpus_help: str | None = None) -> None:
    """``--executor`` and what each Slurm job asks for; ``nodes``: the study takes ``--nodes`` (its jobs' nodes);
    ``gpus_help``: ``--gpus-per-node``'s help where the command reads it beyond Slurm (``plan``: the cluster's)."""
    g = p.add_argument_group("Slurm (--executor slurm: each job a batch job of its own)")
    g.add_argument("--executor", default="local", choices=EXECUTORS,
                   help="local: each job on this node or --hostfile, one at a time (default); slurm: each job an "
                        "sbatch job, independent jobs queued at once")
    if nodes:
        g.add_argument("--nodes", type=int, default=None, help="nodes of each Slurm job (default 1)")
    g.add_argument("--partition", default=None, help="Slurm partition of each job (default: the cluster's)")
    g.add_argument("--account", default=None, help="Slurm account of each job")
    g.add_argument("--gpus-per-node", type=int, default=0, help=gpus_help or (
        "GPUs each Slurm job asks for per node; 0 (default): none asked for (CPU partition)"))
    g.add_argument("--mpi", default=None, help="srun --mpi plugin of each job, e.g. pmix (rank 0 shares its address "
                                               "through it; without one, --iface's address on the first node)")
    g.add_argument("--max-jobs", type=int, default=None,
                   help="Slurm jobs of the study queued or running at once (default: every independent point)")
    g.add_argument("--queue-timeout", default="1d", metavar="DURATION",
                   help="how long a Slurm job may wait in the queue before it is cancelled and the point failed: 30m, "
                        "12h (default 1d)")


def job_options(args: argparse.Namespace, local_mpirun: bool = False) -> dict:
    """The job flags, checked (one line naming the flag, before anything starts), as spec fields:
    ``results``, ``launcher``, ``hostfile``, ``iface``, ``master_port``, ``timeout_s``. ``local_mpirun``: the
    study writes each job's hostfile itself, so mpirun needs no ``--hostfile`` (scaling)."""
    from ds_bench.config.preflight import check_results_path

    argcheck.at_least("--nproc", getattr(args, "nproc", None), 1)
    argcheck.port("--master-port", args.master_port)
    slurm = slurm_options(args)  # first: its refusals (a hostfile, a launcher) name the executor
    launcher = args.launcher or default_launcher(args.hostfile, getattr(args, "executor", "local"))
    if not (local_mpirun and launcher == "mpirun"):
        argcheck.job_launcher(launcher, args.hostfile)
    check_results_path(args.results)
    timeout_s = parse_duration("--timeout", args.timeout)
    return {"results": args.results, "launcher": launcher, "hostfile": args.hostfile, "iface": args.iface,
            "master_port": args.master_port, "timeout_s": timeout_s, "slurm": slurm}


def default_launcher(hostfile: str | None, executor: str = "local") -> str:
    """A study's launcher when ``--launcher`` is left out (pure): srun for Slurm jobs (``--executor slurm``), the
    deepspeed launcher for a hostfile's hosts, else torchrun, the lightest start on one node. A job's wall time
    around its ranks, ``make bench``'s 15 points on a 2-core AMD EPYC (2026-11-26): torchrun ~1.3 s to rank 0's
    start and ~0.5 s after the measured window; the deepspeed launcher ~3.5 s and ~2.8 s (its own interpreter,
    DeepSpeed imported twice, a 1 s poll of its ranks). The ranks' threads are the same under both
    (``spawn.rank_threads``)."""
    if executor == "slurm":
        return "srun"
    return "deepspeed" if hostfile else "torchrun"


def slurm_gpus(args: argparse.Namespace) -> int:
    """Under ``--executor slurm``, the GPUs each job asks for per node: the default ranks per node (the node the
    study runs on, a login node, may have none)."""
    return args.gpus_per_node if getattr(args, "executor", "local") == "slurm" else 0


def slurm_options(args: argparse.Namespace) -> SlurmOptions | None:
    """The Slurm flags, checked (None with ``--executor local``, which refuses them); that the cluster answers and
    has ``--partition`` is the study's last check (``runner.check_cluster``), once every flag is."""
    nodes = getattr(args, "nodes", None) if isinstance(getattr(args, "nodes", None), int) else None
    if args.executor == "local":
        given = [f for f, v in (("--nodes", nodes), ("--partition", args.partition), ("--account", args.account),
                                ("--gpus-per-node", args.gpus_per_node or None), ("--mpi", args.mpi),
                                ("--max-jobs", args.max_jobs)) if v is not None]
        if given:
            raise UserError(f"{given[0]} is for Slurm jobs: add --executor slurm (or leave it out)")
        return None
    if args.hostfile:
        raise UserError("--hostfile with --executor slurm: each job's hosts are its allocation (--nodes); leave "
                        "--hostfile out")
    if args.launcher not in (None, "srun"):
        raise UserError(f"--launcher {args.launcher} with --executor slurm: each job starts its ranks with srun; "
                        "leave --launcher out")
    for flag, value, low in (("--nodes", nodes, 1), ("--gpus-per-node", args.gpus_per_node, 0),
                             ("--max-jobs", args.max_jobs, 1)):
        argcheck.at_least(flag, value, low)
    queue_timeout_s = parse_duration("--queue-timeout", args.queue_timeout)
    return SlurmOptions(nodes=nodes or 1, partition=args.partition, account=args.account,
                        gpus_per_node=args.gpus_per_node, mpi=args.mpi, max_jobs=args.max_jobs,
                        queue_timeout_s=queue_timeout_s)


def axis_flags() -> dict[str, str]:
    """Each study axis a registered degree or memory switch gives, as its ``RunConfig`` field -> flag: the run
    options a study sets per point itself (read at call time: a degree registered later is one more)."""
    return {**{d.field: d.flag for d in DEGREES}, **{s.field: s.option for s in SWITCHES}}


def add_degree_arguments(p: argparse.ArgumentParser, what: str = "point", default: str = "1") -> None:
    """One list flag per parallel degree, e.g. ``--pipeline-stages 1,2``; ``default`` ``auto``: every value that can
    be (``degrees_of`` gives an empty tuple)."""
    for d in DEGREES:
        p.add_argument(d.flag, default=default, help=f"{d.what} per {what}, e.g. 1,2 (default {default}; labels "
                                                     f"{d.word}2 ...)")


def degrees_of(args: argparse.Namespace) -> dict[str, tuple[int, ...]]:
    """``{"pipeline_stages": (1, 2), ...}`` from the degree flags, each value a positive integer; ``auto``: ()."""
    out = {}
    for d in DEGREES:
        if getattr(args, d.field) == "auto":
            out[d.field] = ()
            continue
        values = parse_list(d.flag, getattr(args, d.field), kind=int)
        for v in values:
            argcheck.at_least(d.flag, v, 1)
        out[d.field] = values
    return out


def run_flags_of(workload: str, run_args) -> argparse.Namespace:
    """The ``run`` flags a study gives every job (``run_args``: its ``--size``, ``--seq-len``, ``--data`` and ``--``
    tail), parsed as ``ds-bench run``'s parser reads them (``RunConfig`` field names; values not yet checked)."""
    flags, _ = parse_run_tail(["--workload", workload, "--ds-config", "-"], list(run_args))
    return flags


def add_switch_arguments(p: argparse.ArgumentParser, what: str = "point", every_planned: bool = False) -> None:
    """One list flag per run switch (``config.run_switches``): ``--tiled-mlp off,on``, ``--optimizer adamw,muon``;
    ``every_planned``: a switch the performance model has a term for (``Switch.planned``) takes all its values by
    default (``ds-bench plan``)."""
    for s in SWITCHES:
        values = ",".join(s.axis_values)
        every = every_planned and s.planned
        default = values if every else "off" if not s.choices else "default: the base config's"
        p.add_argument(s.option, dest=s.field, default=values if every else None, metavar=values,
                       help=f"{values} (a list): {s.what}, per {what} (default {default}; labels {s.key_word(s.axis_values[-1] if s.choices else True)})")


def switches_of(args: argparse.Namespace) -> dict[str, tuple]:
    """``{"tiled_mlp": (False, True), "optimizer": ("adamw", "muon"), ...}`` from the switch flags, each value one of
    the switch's (``Switch.of_axis``: ``on`` -> True, ``ulysses`` -> ""); a flag not given: off."""
    return {s.field: tuple(s.of_axis(v) for v in parse_list(s.option, getattr(args, s.field), allowed=s.axis_values))
            if getattr(args, s.field, None) is not None else (s.off,) for s in SWITCHES}


def add_stack_arguments(p: argparse.ArgumentParser) -> None:
    """``--deepspeed``, ``--torch``, ``--transformers`` (``config.stacks.PACKAGES``): the stack axis."""
    from ds_bench.config.stacks import INSTALLED, PACKAGES

    g = p.add_argument_group("the software stack as an axis (docs/stacks.md)")
    for package in PACKAGES:
        g.add_argument(package.flag, dest=f"stack_{package.name}", default=None, metavar="VERSION,...",
                       help=f"{package.name} releases to run every point with, e.g. {package.oldest},{INSTALLED}: each "
                            f"an environment of its own, built once (default: this environment's; oldest supported "
                            f"{package.oldest})")


def stacks_from(args: argparse.Namespace):
    """The study's stacks (``config.stacks.stacks_of``), each flag's versions checked; one stack, this
    environment, without the flags."""
    from ds_bench.config.stacks import PACKAGES, installed_versions, parse_versions, stacks_of

    given = {p.name: parse_versions(p.flag, text, p.oldest) for p in PACKAGES
             if (text := getattr(args, f"stack_{p.name}", None)) is not None}
    return stacks_of(given, installed_versions())
