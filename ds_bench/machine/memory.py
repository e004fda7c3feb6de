"""A rank's memory: the cap on CPU ranks, what it holds before the model, its peak, and whether an
error was an out-of-memory.

- ``cap_process_memory``: ``--cpu-mem-limit`` sets RLIMIT_DATA (the process's private writable
  address space: heap and anonymous mappings, what tensors live in). On CPU ranks an allocation past
  it fails the way a GPU allocation fails past the device's memory, so a micro-batch that does not
  fit ends as an out-of-memory here too. The cap bounds address space, which is at least the
  resident set, so a run can fail to allocate while its RSS is still below the cap.
- ``current_bytes`` / ``peak_bytes``: GPU: ``memory_allocated`` / ``max_memory_allocated`` (and
  reserved); CPU: RSS now / peak RSS (``ru_maxrss``, which Linux reports in KiB).
- ``is_out_of_memory``: torch's ``OutOfMemoryError`` (CUDA), Python's ``MemoryError``, or the CPU
  allocator's failure, which torch raises as a plain ``RuntimeError`` saying
  ``DefaultCPUAllocator: can't allocate memory`` (c10/core/impl/alloc_cpu.cpp); anywhere in the
  exception's cause chain. The run stores the verdict as ``failure.kind``, so nothing downstream
  reads free text.
"""

from __future__ import annotations

import re
import resource

import psutil
import torch

_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "m": 2**20, "mib": 2**20, "g": 2**30, "gib": 2**30,
          "t": 2**40, "tib": 2**40, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
CPU_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"


def parse_size(text: str) -> int:
    """``4GiB``, ``512MiB``, ``3G`` (binary), ``2GB`` (decimal) or plain bytes -> bytes (pure)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m and m.group(2).lower()
    if not m or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; expected e.g. 4GiB, 512MiB or a number of bytes")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{text!r}: a size must be > 0")
    return value


def cap_process_memory(limit_bytes: int) -> None:
    """The one place the cap is applied (soft and hard: the run cannot lift it)."""
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes))


def current_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return int(psutil.Process().memory_info().rss)


def peak_bytes(device: torch.device) -> dict[str, int]:
    if device.type == "cuda":
        return {"allocated": torch.cuda.max_memory_allocated(device),
                "reserved": torch.cuda.max_memory_reserved(device)}
    return {"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def is_out_of_memory(error: BaseException | None) -> bool:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
            return True
        if isinstance(error, RuntimeError) and CPU_ALLOCATOR_FAILURE in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False
