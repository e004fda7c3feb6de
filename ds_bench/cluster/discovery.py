"""Rank discovery: which process am I, out of how many, and where is the rendezvous.

``discover`` is a pure function of an environment mapping. It takes the first of these that is
present and reads only that launcher's variables:

1. torch-style ``RANK`` + ``WORLD_SIZE``, with ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``/``LOCAL_SIZE``
   and ``GROUP_RANK``/``CROSS_RANK``/``NODE_RANK``. Source "deepspeed" when ``CROSS_RANK`` and
   ``CROSS_SIZE`` are set (deepspeed.launcher.launch sets them next to ``LOCAL_SIZE``; its MPICH
   and Intel MPI runners set only ``LOCAL_SIZE``, which is not specific enough), "torchrun" when
   ``TORCHELASTIC_RUN_ID`` or ``GROUP_RANK`` is set, else "env".
2. Open MPI ``OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE`` ("openmpi"). Not
   ``OMPI_COMM_WORLD_NODE_RANK``: despite its name it is a rank within the node across all jobs,
   not the node's index, so the node rank is left to ``mpi_discovery.complete_with_mpi``.
3. PMIx ``PMIX_RANK`` ("pmix"); PMIx exports no world size, which stays None.
4. MVAPICH ``MV2_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE`` ("mvapich").
5. MPICH / Intel MPI / PMI ``PMI_RANK/PMI_SIZE``, ``MPI_LOCALRANKID/MPI_LOCALNRANKS`` ("pmi").
6. Slurm ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``, tasks per node
   from ``SLURM_STEP_TASKS_PER_NODE``/``SLURM_TASKS_PER_NODE`` (indexed by node id) or
   ``SLURM_NTASKS_PER_NODE``; hosts from ``SLURM_STEP_NODELIST``, ``SLURM_JOB_NODELIST`` or
   ``SLURM_NODELIST``, and the first host is the master address ("slurm").
7. Nothing: a one-rank run, rank 0 of 1 ("single").

MPI variables come before Slurm's because ``mpirun`` inside a Slurm allocation inherits the
allocation's ``SLURM_*`` while the MPI variables describe the processes actually started. Under
``srun --mpi=pmix`` (or pmi2) both exist: when ``SLURM_PROCID`` equals the MPI rank and every
field both know agrees, Slurm fills the fields the MPI path left empty (world and local sizes,
node rank, hosts).

``MASTER_ADDR``/``MASTER_PORT`` are honoured on every path. Otherwise the master address stays
None outside Slurm, for the caller to choose (``mpi_discovery.complete_with_mpi``, ``netif.choose_interface``).
An empty variable counts as unset. Values that are not integers, or that contradict each other,
raise ``UserError`` naming the variables.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ds_bench.cluster.slurm import expand_nodelist, tasks_per_node
from ds_bench.errors import UserError

NEEDED = ("rank", "world_size", "local_rank", "master_addr")


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the run; None means the environment did not say."""

    rank: int | None
    world_size: int | None
    local_rank: int | None
    local_world_size: int | None
    node_rank: int | None
    master_addr: str | None
    master_port: int | None
    source: str
    hosts: tuple[str, ...] = ()

    def missing(self) -> list[str]:
        """Names of the fields a run needs that are still None."""
        return [name for name in NEEDED if getattr(self, name) is None]


# field -> variables to try, in order; "rank" comes first and is the path's trigger.
_TORCH = {"rank": ("RANK",), "world_size": ("WORLD_SIZE",), "local_rank": ("LOCAL_RANK",),
          "local_world_size": ("LOCAL_WORLD_SIZE", "LOCAL_SIZE"),
          "node_rank": ("GROUP_RANK", "CROSS_RANK", "NODE_RANK")}
_MPI_PATHS = (
    ("openmpi", {"rank": ("OMPI_COMM_WORLD_RANK",), "world_size": ("OMPI_COMM_WORLD_SIZE",),
                 "local_rank": ("OMPI_COMM_WORLD_LOCAL_RANK",),
                 "local_world_size": ("OMPI_COMM_WORLD_LOCAL_SIZE",)}),
    ("pmix", {"rank": ("PMIX_RANK",)}),
    ("mvapich", {"rank": ("MV2_COMM_WORLD_RANK",), "world_size": ("MV2_COMM_WORLD_SIZE",),
                 "local_rank": ("MV2_COMM_WORLD_LOCAL_RANK",),
                 "local_world_size": ("MV2_COMM_WORLD_LOCAL_SIZE",)}),
    ("pmi", {"rank": ("PMI_RANK",), "world_size": ("PMI_SIZE",),
             "local_rank": ("MPI_LOCALRANKID",), "local_world_size": ("MPI_LOCALNRANKS",)}),
)
_SLURM = {"rank": ("SLURM_PROCID",), "world_size": ("SLURM_NTASKS", "SLURM_NPROCS"),
          "local_rank": ("SLURM_LOCALID",), "node_rank": ("SLURM_NODEID",)}
_SIZES = ("world_size", "local_world_size")
_INT_FIELDS = ("rank", "world_size", "local_rank", "local_world_size", "node_rank")
_SINGLE = {"rank": ("", 0), "world_size": ("", 1), "local_rank": ("", 0),
           "local_world_size": ("", 1), "node_rank": ("", 0)}

Fields = dict[str, tuple[str, int]]  # field -> (variable it came from, value)


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name, "").strip()
    return value or None


def _int(env: Mapping[str, str], name: str, minimum: int = 0) -> int | None:
    text = _get(env, name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"environment: {name}={text!r} is not an integer") from None
    if value < minimum:
        raise UserError(f"environment: {name}={text!r}; expected an integer >= {minimum}")
    return value


def _read(env: Mapping[str, str], spec: Mapping[str, tuple[str, ...]]) -> Fields:
    fields: Fields = {}
    for field, names in spec.items():
        for name in names:
            value = _int(env, name, 1 if field in _SIZES else 0)
            if value is not None:
                fields[field] = (name, value)
                break
    return fields


def _check(fields: Fields) -> None:
    for low, high in (("rank", "world_size"), ("local_rank", "local_world_size"),
                      ("local_world_size", "world_size")):
        if low in fields and high in fields:
            (lname, lval), (hname, hval) = fields[low], fields[high]
            strict = low != "local_world_size"
            if lval > hval or (strict and lval == hval):
                relation = "below" if strict else "at most"
                raise UserError(f"environment: {lname}={lval} must be {relation} {hname}={hval}")


def _slurm_local_size(env: Mapping[str, str], node_rank: int | None) -> tuple[str, int] | None:
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        text = _get(env, name)
        if text is not None and node_rank is not None:
            counts = tasks_per_node(text, var=name)
            if node_rank >= len(counts):
                raise UserError(f"environment: SLURM_NODEID={node_rank} is beyond "
                                f"{name}={text!r} ({len(counts)} nodes)")
            return name, counts[node_rank]
    value = _int(env, "SLURM_NTASKS_PER_NODE", 1)
    return None if value is None else ("SLURM_NTASKS_PER_NODE", value)


def _slurm_hosts(env: Mapping[str, str]) -> tuple[str, ...]:
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        text = _get(env, name)
        if text is not None:
            return tuple(expand_nodelist(text, var=name))
    return ()


def _slurm(env: Mapping[str, str]) -> tuple[Fields, tuple[str, ...]]:
    fields = _read(env, _SLURM)
    local_size = _slurm_local_size(env, fields.get("node_rank", (None, None))[1])
    if local_size is not None:
        fields["local_world_size"] = local_size
    return fields, _slurm_hosts(env)


def _agrees(mpi: Fields, slurm: Fields) -> bool:
    shared = set(mpi) & set(slurm)
    return "rank" in shared and all(mpi[f][1] == slurm[f][1] for f in shared)


def _torch_source(env: Mapping[str, str]) -> str:
    if _get(env, "CROSS_RANK") is not None and _get(env, "CROSS_SIZE") is not None:
        return "deepspeed"
    if _get(env, "TORCHELASTIC_RUN_ID") is not None or _get(env, "GROUP_RANK") is not None:
        return "torchrun"
    return "env"


def _choose(env: Mapping[str, str]) -> tuple[str, Fields, tuple[str, ...]]:
    """Pick the path and read its fields; Slurm fills gaps of an agreeing MPI path."""
    if _get(env, "RANK") is not None and _get(env, "WORLD_SIZE") is not None:
        return _torch_source(env), _read(env, _TORCH), ()
    for source, spec in _MPI_PATHS:
        if _get(env, spec["rank"][0]) is not None:
            fields = _read(env, spec)
            if _get(env, "SLURM_PROCID") is None:
                return source, fields, ()
            slurm, hosts = _slurm(env)
            if not _agrees(fields, slurm):
                return source, fields, ()
            return source, {**slurm, **fields}, hosts
    if _get(env, "SLURM_PROCID") is not None:
        return ("slurm", *_slurm(env))
    for present, absent in (("RANK", "WORLD_SIZE"), ("WORLD_SIZE", "RANK")):
        if _get(env, present) is not None:
            raise UserError(
                f"environment: {present} is set but {absent} is not; set both or neither"
            )
    return "single", dict(_SINGLE), ()


def discover(env: Mapping[str, str]) -> RankInfo:
    """Read this process's place in the run from ``env`` (see the module docstring)."""
    source, fields, hosts = _choose(env)
    _check(fields)
    port = _int(env, "MASTER_PORT", 1)
    if port is not None and port > 65535:
        raise UserError(f"environment: MASTER_PORT={port} is not a TCP port; expected 1..65535")
    # Only plain Slurm (no MPI) falls back to the first node's *name*: it has no channel for rank 0
    # to share its choice. MPI paths leave it unset so rank 0 offers its interface's address.
    master_addr = _get(env, "MASTER_ADDR") or (hosts[0] if hosts and source == "slurm" else None)
    values = {field: fields[field][1] if field in fields else None for field in _INT_FIELDS}
    return RankInfo(**values, master_addr=master_addr, master_port=port, source=source,
                    hosts=hosts)
