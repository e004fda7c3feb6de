"""The placements of a scaling study and how each is launched (pure: no file is written, nothing started).

The study's layout is the same at every point (its config and run arguments); a point is where it runs,
a ``Placement``: one world size: ``--ranks 1,2,4`` gives 1, 2 and 4 ranks on this node; ``--hostfile H
--nodes 1,2`` gives the first 1 and 2 hosts of H, each with the slots its line gives. ``job`` is what
``ds_bench.jobs.spawn.command`` reads (launcher, ranks per node, hostfile), so a point is launched
exactly as a sweep point is.
"""

from __future__ import annotations

from dataclasses import dataclass

from ds_bench.jobs.spawn import threads_per_rank  # noqa: F401  (the study's threads per rank)


@dataclass(frozen=True)
class Placement:
    world_size: int
    nodes: int
    per_node: int
    """Ranks on the busiest node."""
    hosts: tuple[tuple[str, int], ...] = ()
    """(host, slots) of the sub-hostfile; empty: this node, no hostfile."""

    @property
    def label(self) -> str:
        return f"n{self.world_size}"


@dataclass(frozen=True)
class Job:
    """What ``jobs.spawn.command`` reads of a job: how and where its ranks start."""
    launcher: str
    nproc: int
    hostfile: str | None
    iface: str | None = None
    nodes: int = 1
    """Under ``--executor slurm``: the nodes of the point's own allocation."""


def rank_points(ranks: tuple[int, ...]) -> tuple[Placement, ...]:
    return tuple(Placement(world_size=n, nodes=1, per_node=n) for n in ranks)


def node_points(hosts: tuple[tuple[str, int], ...], nodes: tuple[int, ...]) -> tuple[Placement, ...]:
    """The first k hosts of the hostfile for each k of ``--nodes``, with their own slots."""
    out = []
    for k in nodes:
        first = hosts[:k]
        out.append(Placement(world_size=sum(s for _, s in first), nodes=k, per_node=max(s for _, s in first),
                         hosts=tuple(first)))
    return tuple(out)


def hostfile_text(hosts: tuple[tuple[str, int], ...]) -> str:
    """A DeepSpeed hostfile, one ``host slots=N`` line per host, in order."""
    return "".join(f"{host} slots={slots}\n" for host, slots in hosts)


def local_hosts(n: int) -> tuple[tuple[str, int], ...]:
    """This node as a hostfile (``mpirun`` on one node starts ranks from a hostfile)."""
    return (("localhost", n),)


def needs_hostfile(point: Placement, launcher: str) -> bool:
    return bool(point.hosts) or launcher == "mpirun"


def job(point: Placement, launcher: str, hostfile: str | None, iface: str | None = None) -> Job:
    return Job(launcher=launcher, nproc=point.per_node, hostfile=hostfile, iface=iface, nodes=point.nodes)


def tag(scaling_id: str, point: Placement) -> str:
    """The ``--tag`` of a point's run; its run record is found again by it."""
    return f"scaling:{scaling_id}:{point.label}"
