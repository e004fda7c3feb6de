"""Launch commands for multi-rank runs, built as pure functions and run in one place.

``ds-bench launch LAUNCHER [options] -- run --workload ...`` prints the command it builds and
runs it (``--dry-run``: print only). Builders return argv lists and are tested on exact output:
- ``mpirun``: Open MPI from a DeepSpeed hostfile (one rank per slot, ``--host a:4,b:4``); ranks
  find each other through OMPI_COMM_WORLD_* and mpi4py, and with ``--iface`` Open MPI's own
  traffic and ds_bench's rendezvous are pinned to that interface;
- ``deepspeed``: the DeepSpeed launcher with the hostfile and include/exclude filters; the master
  address is passed explicitly (its default asks the first host for ``hostname -I``); a hostfile
  naming only this machine (``localhost``) skips the launcher's ssh check;
- ``torchrun``: the static multi-node form, one command per node (``--node-rank``);
- ``srun``: one task per GPU under Slurm; ds_bench reads SLURM_* (and PMI under ``--mpi``).
"""

from __future__ import annotations

import argparse
import dataclasses
import socket
import subprocess
import sys
from dataclasses import dataclass

from ds_bench.cluster.hostfile import filter_slots, load_hostfile, world_info
from ds_bench.config import argcheck
from ds_bench.config.run_flags import add_iface_argument
from ds_bench.config.study_flags import LAUNCHERS
from ds_bench.errors import UserError

DEFAULT_COMMAND = ("run", "--workload", "mnist", "--ds-config", "ds_configs/zero2.json")
"""What ``ds-bench launch`` starts when nothing follows ``--``."""


@dataclass(frozen=True)
class LaunchSpec:
    """One launch, typed: the ``ds-bench launch`` flags, or what a sweep or scaling job asks for."""

    launcher: str
    run_args: tuple[str, ...] = ()
    """The ds-bench command every rank runs (``run ...``, ``comm ...``); empty: ``DEFAULT_COMMAND``."""
    hostfile: str | None = None
    include: str = ""
    exclude: str = ""
    nnodes: int | None = None
    nproc_per_node: int | None = None
    node_rank: int = 0
    master_addr: str | None = None
    master_port: int = 29500
    iface: str | None = None
    mpi: str | None = None
    gpus_per_node: int = 0
    """srun only: ``--gpus-per-node`` for the step; 0 asks for no GPUs (a CPU partition, no GRES)."""
    python: str | None = None
    """The ranks' Python under mpirun and srun (a study's stack environment: ``ds_bench.machine.stack_envs``);
    None: this one. The deepspeed launcher and torchrun run their own environment's (``spawn.beside_python``)."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> LaunchSpec:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in vars(args).items() if k in names and k != "run_args"},
                   run_args=tuple(args.run_args))


def mpirun_command(slots: dict[str, list[int]], run_args: list[str], *, python: str,
                   iface: str | None = None) -> list[str]:
    for host, ids in slots.items():
        if ids != list(range(len(ids))):
            raise UserError(f"--include/--exclude: mpirun starts ranks by count, so {host} needs slots "
                            f"0..{len(ids) - 1}, not {ids}; pick GPUs with the deepspeed launcher instead")
    _, world = world_info(slots)
    argv = ["mpirun", "-np", str(world), "--host", ",".join(f"{h}:{len(s)}" for h, s in slots.items()),
            "--map-by", "slot", "-x", "PATH"]
    if iface:
        argv += ["--mca", "oob_tcp_if_include", iface, "--mca", "btl_tcp_if_include", iface,
                 "-x", f"DS_BENCH_IFACE={iface}"]
    return argv + [python, "-m", "ds_bench", *run_args]


def deepspeed_command(hostfile: str, run_args: list[str], *, master_addr: str, master_port: int,
                      include: str = "", exclude: str = "", local_only: bool = False) -> list[str]:
    """``local_only``: every host is this machine, so skip the launcher's ssh check (it fails
    without an ssh server even for ``localhost``) and it then starts the ranks locally."""
    argv = ["deepspeed", "--hostfile", hostfile, "--master_addr", master_addr, "--master_port", str(master_port)]
    argv += ["--no_ssh_check"] if local_only else []
    argv += ["--include", include] if include else []
    argv += ["--exclude", exclude] if exclude else []
    return argv + ["--module", "ds_bench", *run_args]


def torchrun_command(run_args: list[str], *, nnodes: int, nproc_per_node: int, node_rank: int,
                     master_addr: str, master_port: int) -> list[str]:
    return ["torchrun", "--nnodes", str(nnodes), "--nproc_per_node", str(nproc_per_node), "--node_rank",
            str(node_rank), "--master_addr", master_addr, "--master_port", str(master_port),
            "-m", "ds_bench", *run_args]


def srun_command(run_args: list[str], *, nnodes: int, tasks_per_node: int, python: str,
                 mpi: str | None = None, gpus_per_node: int = 0) -> list[str]:
    argv = ["srun", "--nodes", str(nnodes), "--ntasks-per-node", str(tasks_per_node), "--kill-on-bad-exit=1"]
    argv += [f"--mpi={mpi}"] if mpi else []
    # Only when non-zero: a GRES request on a partition (or cluster) without GPUs fails the step with
    # "Invalid generic resource (gres) specification".
    argv += [f"--gpus-per-node={gpus_per_node}"] if gpus_per_node else []
    return argv + [python, "-m", "ds_bench", *run_args]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("launcher", choices=LAUNCHERS)
    p.add_argument("--hostfile", help="DeepSpeed hostfile (mpirun, deepspeed; sizes the others)")
    p.add_argument("--include", default="", help="DeepSpeed filter, e.g. node01:0,1@node02")
    p.add_argument("--exclude", default="", help="DeepSpeed filter, e.g. node02:3")
    p.add_argument("--nnodes", type=int, default=None)
    p.add_argument("--nproc-per-node", type=int, default=None)
    p.add_argument("--node-rank", type=int, default=0, help="torchrun: this node's index")
    p.add_argument("--master-addr", default=None, help="default: the first host")
    p.add_argument("--master-port", type=int, default=29500)
    add_iface_argument(p)
    p.add_argument("--mpi", default=None, help="srun --mpi plugin, e.g. pmix")
    p.add_argument("--gpus-per-node", type=int, default=0,
                   help="srun: GPUs the step asks for on each node; 0 (default): none asked for (CPU partition)")
    p.add_argument("--dry-run", action="store_true", help="print the command, run nothing")


def is_local_host(name: str, own_names: tuple[str, ...]) -> bool:
    """``localhost``, a loopback address, or one of this machine's own names."""
    return name == "localhost" or name.startswith("127.") or name in own_names


def own_host_names() -> tuple[str, ...]:
    full = socket.gethostname()
    return (full, full.split(".")[0], socket.getfqdn())


def check_args(spec: LaunchSpec) -> None:
    """Launch arguments, before anything is built or started (the command after ``--`` is checked by
    the CLI router, which knows every command's flags)."""
    argcheck.at_least("--nnodes", spec.nnodes, 1)
    argcheck.at_least("--nproc-per-node", spec.nproc_per_node, 1)
    argcheck.at_least("--node-rank", spec.node_rank, 0)
    argcheck.at_least("--gpus-per-node", spec.gpus_per_node, 0)
    argcheck.port("--master-port", spec.master_port)
    if (spec.include or spec.exclude) and not spec.hostfile:
        raise UserError(f"--{'include' if spec.include else 'exclude'} filters the hosts of a hostfile: "
                        "give --hostfile too")
    if spec.mpi and spec.launcher != "srun":
        raise UserError(f"--mpi is an srun option; ds-bench launch {spec.launcher} does not use it")
    if spec.gpus_per_node and spec.launcher != "srun":
        raise UserError(f"--gpus-per-node is an srun option; ds-bench launch {spec.launcher} does not use it")


def build(spec: LaunchSpec) -> list[str]:
    check_args(spec)
    run_args = list(spec.run_args or DEFAULT_COMMAND)
    slots = _slots(spec)
    nnodes = spec.nnodes or (len(slots) if slots else 1)
    per_node = spec.nproc_per_node or (max(len(s) for s in slots.values()) if slots else 1)
    if spec.node_rank >= nnodes:
        raise UserError(f"--node-rank must be below the number of nodes ({nnodes}), got {spec.node_rank}")
    master = spec.master_addr or (next(iter(slots)) if slots else "127.0.0.1")
    if spec.iface and spec.launcher != "mpirun":
        run_args = run_args[:1] + ["--iface", spec.iface] + run_args[1:]
    if spec.launcher == "mpirun":
        return mpirun_command(_need(slots, spec), run_args, python=spec.python or sys.executable, iface=spec.iface)
    if spec.launcher == "deepspeed":
        _need(slots, spec)
        local = all(is_local_host(h, own_host_names()) for h in slots)
        return deepspeed_command(spec.hostfile, run_args, master_addr=master, master_port=spec.master_port,
                                 include=spec.include, exclude=spec.exclude, local_only=local)
    if spec.launcher == "torchrun":
        return torchrun_command(run_args, nnodes=nnodes, nproc_per_node=per_node, node_rank=spec.node_rank,
                                master_addr=master, master_port=spec.master_port)
    return srun_command(run_args, nnodes=nnodes, tasks_per_node=per_node, python=spec.python or sys.executable, mpi=spec.mpi,
                        gpus_per_node=spec.gpus_per_node)


def _slots(spec: LaunchSpec) -> dict[str, list[int]]:
    if not spec.hostfile:
        return {}
    return filter_slots(load_hostfile(spec.hostfile), spec.include, spec.exclude)


def _need(slots: dict[str, list[int]], spec: LaunchSpec) -> dict[str, list[int]]:
    if not slots:
        raise UserError(f"ds-bench launch {spec.launcher}: --hostfile is required")
    return slots


def run_child(argv: list[str]) -> int:
    """The one place ds_bench starts a launcher; its exit code is passed on."""
    try:
        return subprocess.run(argv, check=False).returncode
    except FileNotFoundError:
        raise UserError(f"{argv[0]}: not found on PATH (activate the environment that has it)") from None
