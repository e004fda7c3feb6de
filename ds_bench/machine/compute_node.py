"""The machine a study's jobs run on (``ComputeNode``): what a study derives from it (precision, ranks per node,
memory per rank, the default workload) and the one line that says where those figures came from.

Locally it is this machine (``this_machine``). Under ``--executor slurm`` it is the partition's nodes, read from
Slurm's node records (``ds_bench.jobs.compute_nodes``), since the login node a study is submitted from may have
no GPU and another CPU. ``--compute-node KEY=VALUE,...`` (``parse_override``) sets any figure by hand and wins
over both.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ds_bench.config.parsers import parse_memory
from ds_bench.errors import UserError

OVERRIDE_FLAG = "--compute-node"
OVERRIDE_KEYS = {
    "gpus": "GPUs per node (0: CPU nodes)",
    "gpu": "the GPU's family, e.g. H100 (its memory from the device table)",
    "gpu-memory": "one GPU's memory, e.g. 80GiB",
    "bf16": "native or emulated (CPU nodes: whether the CPU computes bf16 itself)",
    "cpus": "CPU cores per node",
    "memory": "a node's memory, e.g. 512GiB",
}
"""What ``--compute-node`` takes, key -> meaning (its help and its error name them)."""


@dataclass(frozen=True)
class ComputeNode:
    """One node the jobs run on, as far as it is known (None: not known)."""

    gpus: int
    """GPUs per node; 0: a CPU node."""
    native_bf16: bool | None
    """Whether bf16 runs at full speed: a GPU from Ampere on, a CPU with AVX512_BF16/AMX (``cpu_features``)."""
    cpus: int | None = None
    memory_bytes: int | None = None
    """The node's memory."""
    gpu_name: str | None = None
    """The GPU's name or family (``NVIDIA H100 80GB HBM3``, Slurm's GRES type ``h100``)."""
    gpu_memory_bytes: int | None = None
    where: str = "this machine"
    """Which nodes: ``this machine``, ``partition gpu (gpu[01-04])``."""
    source: str = "this machine"
    """How the figures are known: ``this machine``, ``Slurm's node records``, ``--compute-node``."""

    @property
    def device_type(self) -> str:
        return "cuda" if self.gpus else "cpu"

    @property
    def runs_bf16(self) -> bool:
        """bf16 is a sensible default: native, or a GPU whose support is not known (GPUs from 2020 on have it)."""
        return self.native_bf16 if self.native_bf16 is not None else bool(self.gpus)

    def default_ranks(self) -> int:
        """Ranks per node when ``--nproc`` is left out: one per GPU; on CPU nodes two (one per core up to 2: a
        rank's matmuls use the cores it is given, and two ranks exercise every collective)."""
        return self.gpus if self.gpus else min(2, self.cpus or 1)

    def rank_memory_bytes(self, ranks_per_node: int, cpu_mem_limit: int | None = None) -> int | None:
        """Memory one rank may use: one GPU's; on CPU nodes ``--cpu-mem-limit``, else the node's shared by its
        ranks. None: not known."""
        if self.gpus:
            return self.gpu_memory_bytes
        if cpu_mem_limit:
            return int(cpu_mem_limit)
        return None if self.memory_bytes is None else self.memory_bytes // max(1, ranks_per_node)

    def line(self) -> str:
        """The study's first line: where its jobs run and what that gives it."""
        if self.gpus:
            memory = f", {self.gpu_memory_bytes / 2**30:.0f} GiB each" if self.gpu_memory_bytes else ""
            device = f"{self.gpus} GPU(s) per node ({self.gpu_name or 'type not known'}{memory})"
            bf16 = {True: "bf16 native", False: "no bf16 (pre-Ampere)", None: "bf16 assumed native"}[self.native_bf16]
        else:
            device = "no GPU"
            bf16 = {True: "bf16 native", False: "bf16 emulated (no avx512_bf16/amx_bf16)",
                    None: "bf16 support not known"}[self.native_bf16]
        parts = [device, bf16]
        if self.cpus:
            parts.append(f"{self.cpus} CPUs")
        if self.memory_bytes:
            parts.append(f"{self.memory_bytes / 2**30:.0f} GiB per node")
        return f"compute nodes: {self.where}: {', '.join(parts)} (from {self.source})"


def this_machine() -> ComputeNode:
    """This machine: its CUDA devices (torch), its CPU's flags, cores and memory."""
    import psutil
    import torch

    from ds_bench.machine.cpu_features import this_cpu_has_native_bf16

    cpus, memory = os.cpu_count(), psutil.virtual_memory().total
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return ComputeNode(gpus=torch.cuda.device_count(), native_bf16=torch.cuda.is_bf16_supported(), cpus=cpus,
                           memory_bytes=memory, gpu_name=props.name, gpu_memory_bytes=int(props.total_memory))
    return ComputeNode(gpus=0, native_bf16=this_cpu_has_native_bf16(), cpus=cpus, memory_bytes=memory)


def parse_override(text: str) -> dict:
    """``gpus=4,gpu=H100,bf16=native,cpus=64,memory=512GiB`` -> ``ComputeNode`` fields (pure; ``gpu`` stays a
    name, resolved by ``with_override``)."""
    out: dict = {}
    for item in (part.strip() for part in text.split(",") if part.strip()):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in OVERRIDE_KEYS or not value:
            raise UserError(f"{OVERRIDE_FLAG} {text!r}: {item!r} is not KEY=VALUE with a key of "
                            f"{', '.join(OVERRIDE_KEYS)}, e.g. gpus=4,gpu=H100")
        out.update(_override_value(text, key, value))
    if not out:
        raise UserError(f"{OVERRIDE_FLAG} {text!r}: give KEY=VALUE pairs, e.g. gpus=4,gpu=H100 or gpus=0,bf16=native")
    return out


def _override_value(text: str, key: str, value: str) -> dict:
    if key in ("memory", "gpu-memory"):
        field = "memory_bytes" if key == "memory" else "gpu_memory_bytes"
        return {field: parse_memory(f"{OVERRIDE_FLAG} {key}", value)}
    if key in ("gpus", "cpus"):
        low = 0 if key == "gpus" else 1
        if not value.isdigit() or int(value) < low:
            raise UserError(f"{OVERRIDE_FLAG} {text!r}: {key}={value}: expected a whole number"
                            + (" >= 1" if low else ""))
        return {key: int(value)}
    if key == "bf16":
        if value not in ("native", "emulated"):
            raise UserError(f"{OVERRIDE_FLAG} {text!r}: bf16={value}: expected native or emulated")
        return {"native_bf16": value == "native"}
    return {"gpu_name": value}


def with_override(node: ComputeNode, fields: dict, gpu_memory_of, gpu_bf16) -> ComputeNode:
    """``node`` with ``--compute-node``'s figures; ``gpu=NAME`` also gives the GPU's memory (``gpu_memory_of``:
    name -> bytes or None) unless ``gpu-memory`` does; a device changed by ``gpus``/``gpu`` without ``bf16`` takes
    its bf16 from the new device (``gpu_bf16``: name -> bool or None; CPU nodes: not known)."""
    if not fields:
        return node
    fields = dict(fields)
    if "gpu_name" in fields and "gpu_memory_bytes" not in fields:
        fields["gpu_memory_bytes"] = gpu_memory_of(fields["gpu_name"])
    if fields.get("gpus") == 0:
        fields.update(gpu_name=None, gpu_memory_bytes=None)
    if ("gpus" in fields or "gpu_name" in fields) and "native_bf16" not in fields:
        gpus, name = fields.get("gpus", node.gpus), fields.get("gpu_name", node.gpu_name)
        fields["native_bf16"] = gpu_bf16(name) if gpus else None
    changed = dataclasses.replace(node, **fields)
    if changed.gpu_name and not changed.gpus:
        raise UserError(f"{OVERRIDE_FLAG}: gpu={changed.gpu_name} on nodes with no GPU known: give gpus=N too")
    return dataclasses.replace(changed, source=f"{node.source} and {OVERRIDE_FLAG}")
