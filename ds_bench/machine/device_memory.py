"""How much memory one rank may use on this machine: the capacity a sweep prunes against and a capacity search
is bounded by (a GPU's total memory, or on CPU ranks the ``--cpu-mem-limit`` cap, else the machine's share).

torch is imported only for a GPU: the studies that ask run without it.
"""

from __future__ import annotations

import psutil


def device_capacity_bytes(device_type: str, ranks_per_node: int, cpu_mem_limit: int | None = None) -> int:
    """Memory one rank may use: a GPU's total memory (device 0), or on CPU ranks the
    ``--cpu-mem-limit`` cap, else the machine's MemTotal shared by its ranks."""
    if device_type == "cuda":
        import torch

        return int(torch.cuda.get_device_properties(0).total_memory)
    if device_type != "cpu":
        raise ValueError(f"device type {device_type!r}: capacity is known for cuda and cpu")
    if cpu_mem_limit:
        return int(cpu_mem_limit)
    return int(psutil.virtual_memory().total // max(1, ranks_per_node))
