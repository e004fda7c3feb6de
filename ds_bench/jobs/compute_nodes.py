"""Where a study's jobs run (``for_study``): this machine, or under ``--executor slurm`` the partition's nodes as
Slurm's node records describe them, then ``--compute-node``'s figures on top (``machine.compute_node``).

From a node record (``sinfo -N -o NODE_FORMAT``): GRES gives the GPUs per node and their type (``gpu:h100:4``;
the type's family in ``perf.devices`` gives one GPU's memory, and a pre-Ampere type says no bf16); features give
the CPU's bf16 when an admin lists CPU flags there (``avx512_bf16``, ``amx_bf16``; flags without either: emulated;
no CPU flag at all: not known); CPUs and memory are the node's. Nodes that differ count as the least of them (a
job may land on any), and the line says so. Slurm clients missing or silent (a ``--dry-run`` away from the cluster):
the figures come from the flags alone (``--gpus-per-node``), said in the line; a study that runs then stops at its
check of the cluster (``runner.check_cluster``), once every flag is checked.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import socket
from dataclasses import dataclass

from ds_bench.errors import UserError
from ds_bench.machine.compute_node import ComputeNode, parse_override, this_machine, with_override
from ds_bench.machine.cpu_features import NATIVE_BF16_FLAGS

NODE_FORMAT = "%N|%P|%G|%f|%c|%m"
"""Node name, partition (``*``: the default one), GRES, features, CPUs, memory in MB: one line per node and
partition."""
PRE_AMPERE = ("v100", "p100", "t4", "k80", "p40", "rtx8000", "rtx6000", "quadro")
"""GRES types of GPUs without bf16 (compute capability below 8.0)."""
X86_FLAGS = re.compile(r"^(sse\d.*|avx.*|amx.*|fma\d?)$")
"""Feature names that are CPU flags: an admin who lists these lists the CPU's, so a missing bf16 flag means none."""


@dataclass(frozen=True)
class NodeRecord:
    name: str
    partition: str
    default: bool
    gpus: int
    gpu_type: str | None
    features: frozenset[str]
    cpus: int | None
    memory_mb: int | None


def parse_records(text: str) -> list[NodeRecord]:
    """``sinfo -h -N -o NODE_FORMAT``'s lines -> records (pure); lines of another shape are skipped."""
    out = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6:
            continue
        name, partition, gres, features, cpus, memory = fields
        gpus, gpu_type = parse_gres(gres)
        out.append(NodeRecord(name, partition.rstrip("*"), partition.endswith("*"), gpus, gpu_type,
                              frozenset(f.lower().replace("-", "_") for f in features.split(",")
                                        if f and f != "(null)"),
                              _number(cpus), _number(memory)))
    return out


def parse_gres(gres: str) -> tuple[int, str | None]:
    """``gpu:h100:4(S:0-1),shard:8`` -> (4, "h100"); ``gpu:2`` -> (2, None); ``(null)`` -> (0, None) (pure)."""
    count, kind = 0, None
    for item in re.sub(r"\(.*?\)", "", gres).split(","):  # a socket list may hold commas: S:0,2
        parts = item.split(":")
        if parts[0] != "gpu" or len(parts) < 2:
            continue
        n = _number(parts[-1])
        count += n if n is not None else 1
        if len(parts) >= 3 and kind is None:
            kind = parts[1].lower()
    return count, kind


def _number(text: str) -> int | None:
    match = re.match(r"\d+", text.strip())
    return int(match.group()) if match else None


def cpu_bf16(features: frozenset[str]) -> bool | None:
    """Native bf16 from a node's features: a bf16 flag -> True; other CPU flags only -> False; none -> None."""
    if features & NATIVE_BF16_FLAGS:
        return True
    return False if any(X86_FLAGS.match(f) for f in features) else None


def gpu_bf16(gpu_type: str | None) -> bool | None:
    """False for a pre-Ampere GPU named anywhere in the type (``v100``, ``tesla_v100-sxm2-32gb``; ``rtx6000ada``
    is Ada), True for another named type, None without one (pure)."""
    if gpu_type is None:
        return None
    words = re.split(r"[_\-\s]+", gpu_type.lower())
    return not any(w.startswith(old) and not w.endswith("ada") for w in words for old in PRE_AMPERE)


def node_of(records: list[NodeRecord], partition: str | None, gpu_memory_of) -> ComputeNode:
    """The partition's nodes (``partition`` None: the default one) as one ``ComputeNode``: the least of each figure
    (pure; ``gpu_memory_of``: GRES type -> one GPU's bytes or None)."""
    wanted = set(partition.split(",")) if partition else None  # sbatch takes a list: a job may land in any
    chosen = list({r.name: r for r in records if (r.partition in wanted if wanted else r.default)}.values())
    if not chosen:
        known = ", ".join(sorted({r.partition for r in records})) or "none"
        raise UserError(f"--partition {partition}: Slurm lists no node in it (partitions: {known})" if partition
                        else "--executor slurm: Slurm names no default partition; give --partition")
    gpus = min(r.gpus for r in chosen)
    types = {r.gpu_type for r in chosen if r.gpus}
    gpu_type = types.pop() if len(types) == 1 and gpus else None
    bf16 = {gpu_bf16(r.gpu_type) if gpus else cpu_bf16(r.features) for r in chosen}
    differ = len({(r.gpus, r.gpu_type, r.features, r.cpus, r.memory_mb) for r in chosen}) > 1
    names = ",".join(r.name for r in chosen[:4]) + (",..." if len(chosen) > 4 else "")
    return ComputeNode(
        gpus=gpus, native_bf16=bf16.pop() if len(bf16) == 1 else (False if False in bf16 else None),
        cpus=_least(r.cpus for r in chosen),
        memory_bytes=None if (mb := _least(r.memory_mb for r in chosen)) is None or mb <= 1 else mb * 2**20,
        gpu_name=gpu_type, gpu_memory_bytes=gpu_memory_of(gpu_type) if gpu_type else None,
        where=f"partition {partition or chosen[0].partition} ({len(chosen)} node(s): {names}"
              + ("; they differ: the least of each" if differ else "") + ")",
        source="Slurm's node records")


def _least(values) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def gpu_memory(name: str | None) -> int | None:
    """One GPU's memory from its family in ``perf.devices`` (``h100``, ``NVIDIA H100 80GB HBM3``), else None."""
    from ds_bench.perf.devices import device_row

    row = device_row(re.sub(r"[_\-]+", " ", name)) if name else None  # nvml's names: nvidia_a100-sxm4-80gb
    return row.memory_bytes if row else None


def for_study(args: argparse.Namespace) -> ComputeNode:
    """The compute node of a study's jobs from its flags (``--executor``, ``--partition``, ``--hostfile``,
    ``--gpus-per-node``, ``--compute-node``, ``--dry-run``)."""
    from ds_bench.jobs import slurm_executor

    override = parse_override(args.compute_node) if getattr(args, "compute_node", None) else {}
    if getattr(args, "executor", "local") != "slurm":
        node = this_machine()
        if args.hostfile and not _lists_this_host(args.hostfile):
            node = dataclasses.replace(node, where=f"this machine (not one of {args.hostfile}'s hosts: give "
                                                   f"--compute-node if they differ)")
        return with_override(node, override, gpu_memory, gpu_bf16)
    try:
        node = node_of(parse_records(slurm_executor.sinfo("-N", "-o", NODE_FORMAT)), args.partition, gpu_memory)
    except UserError as e:  # the study's own check of the cluster (``runner.check_cluster``) says it, after the flags'
        gpus = args.gpus_per_node or 0
        node = ComputeNode(gpus=gpus, native_bf16=None,
                           where=f"partition {args.partition}" if args.partition else "the default partition",
                           source=f"--gpus-per-node {gpus} alone; Slurm's node records not read: {e}")
    if args.gpus_per_node and args.gpus_per_node != node.gpus:  # what each job asks for is what it gets
        node = dataclasses.replace(node, gpus=args.gpus_per_node, native_bf16=node.native_bf16 if node.gpus else None,
                                   source=f"{node.source} and --gpus-per-node")
    return with_override(node, override, gpu_memory, gpu_bf16)


def with_job_gpus(job: dict, node: ComputeNode) -> dict:
    """``job_options``' fields with each Slurm job asking for the compute node's GPUs (``--gpus-per-node`` left
    out: the node records' GRES)."""
    slurm = job.get("slurm")
    if slurm is None or slurm.gpus_per_node or not node.gpus:
        return job
    return {**job, "slurm": dataclasses.replace(slurm, gpus_per_node=node.gpus)}


def _lists_this_host(hostfile: str) -> bool:
    from ds_bench.cluster.hostfile import load_hostfile

    here = {socket.gethostname(), socket.gethostname().split(".")[0], "localhost", "127.0.0.1"}
    return bool(here & set(load_hostfile(hostfile)))


def rank_capacity(spec, ranks_per_node: int) -> float:
    """Memory one rank of a study may use (bytes), from its compute node (``spec.compute``; this machine when the
    spec has none). Not known (a GRES without a GPU type): the study's bad input, but for ``--dry-run``, which
    predicts nothing and gets infinity."""
    node = getattr(spec, "compute", None) or this_machine()
    known = node.rank_memory_bytes(ranks_per_node, spec.cpu_mem_limit)
    if known is not None:
        return known
    if getattr(spec, "dry_run", False):
        return float("inf")
    what = "one GPU's memory" if node.gpus else "the nodes' memory"
    raise UserError(f"--compute-node: {what} is not in {node.source} for {node.where}; give it, e.g. --compute-node "
                    + ("gpu=H100 or gpu-memory=80GiB" if node.gpus else "memory=512GiB (or --cpu-mem-limit)"))
