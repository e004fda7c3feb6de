"""A rank's memory: the cap on CPU ranks, what it holds before the model, its peak, and whether an
error was an out-of-memory.

- ``cap_process_memory``: ``--cpu-mem-limit`` sets RLIMIT_DATA (the process's private writable
  address space: heap and anonymous mappings, what tensors live in). On CPU ranks an allocation past
  it fails the way a GPU allocation fails past the device's memory, so a micro-batch that does not
  fit ends as an out-of-memory here too. The cap bounds private address space, not the resident set: a
  run can fail to allocate while its RSS is below the cap, and its peak RSS, which also counts the libraries'
  file pages, can read above it (1.38 GiB under a 1.35 GiB cap, GPT-2 16 x 384 ZeRO-0). Under the cap a
  freed buffer of 128 KiB or more goes back to the OS at once (glibc ``M_MMAP_THRESHOLD`` fixed, which
  also stops glibc raising that threshold after large frees): otherwise ZeRO-3's gathered parameters,
  freed after each module, stay in the heap and count against the cap as if still held, which a GPU's
  caching allocator does not do. Measured (GPT-3 350M shape, seq 16, ZeRO-3 fp32 SGD, 4 CPU ranks,
  AMD EPYC): peak RSS 4338 MiB -> 2220 MiB, step 26.0 s -> 28.0 s. A rank that failed lifts the cap by
  ``RECORD_ROOM_BYTES`` to record why (``lift_cap_for_record``).
- ``current_bytes`` / ``peak_bytes``: GPU: ``memory_allocated`` / ``max_memory_allocated`` (and
  reserved); CPU: RSS now / peak RSS (``ru_maxrss``, which Linux reports in KiB).
- ``held_bytes``: ``current_bytes`` once a CPU rank's C heap has handed its free pages back to the
  OS (glibc ``malloc_trim(0)``): what the process holds, not what its allocator keeps after frees.
  Measured (GPT-2 24 x 256, 122 MiB fp32, 2 ranks, ZeRO-3 ``zero.Init`` with the weight init
  gathered module by module, 61 MiB of parameters per rank): RSS +181 to +244 MiB after the build,
  +102 MiB after the trim (+77 MiB once the garbage collector also ran); glibc raises its mmap
  threshold after a large free, so later large buffers come from the heap and stay resident when freed.
- ``is_out_of_memory``: torch's ``OutOfMemoryError`` (CUDA), Python's ``MemoryError``, or the CPU
  allocator's failure, which torch raises as a plain ``RuntimeError`` saying
  ``DefaultCPUAllocator: can't allocate memory`` (c10/core/impl/alloc_cpu.cpp); anywhere in the
  exception's cause chain. The run stores the verdict as ``failure.kind``, so nothing downstream
  reads free text.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import resource

import psutil
import torch

CPU_ALLOCATOR_FAILURE = "DefaultCPUAllocator: can't allocate memory"


M_MMAP_THRESHOLD = -3  # glibc malloc.h
RETURNED_AT_FREE_BYTES = 128 * 1024


JOIN_MARGIN_BYTES = 128 * 2**20
"""Room the cap must leave above what the process holds: joining the process group maps more (measured,
1 CPU rank, gloo: VmData 236 -> 268 MiB, +32 MiB, for its threads' stacks and buffers; 4x that for
more peers). A cap below held + this fails inside ``init_process_group`` with no record."""


def held_data_bytes() -> int:
    """The process's private writable address space now (``VmData`` of /proc/self/status, what RLIMIT_DATA
    bounds); RSS where there is no /proc."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(psutil.Process().memory_info().rss)


def refuse_cap_below_held(limit_bytes: int, flag: str = "--cpu-mem-limit") -> None:
    """``UserError`` for a cap the process could not even join under (``300MiB``, where the join needs more)."""
    from ds_bench.errors import UserError

    held = held_data_bytes()
    if limit_bytes < held + JOIN_MARGIN_BYTES:
        mib = 2**20
        raise UserError(f"{flag} {limit_bytes} bytes ({limit_bytes / mib:.1f} MiB) is below what this process "
                        f"already holds: {held / mib:.0f} MiB of data (VmData) + {JOIN_MARGIN_BYTES // mib} MiB to "
                        f"join the process group; give at least {-(-(held + JOIN_MARGIN_BYTES) // mib)} MiB")


RECORD_ROOM_BYTES = 64 * 2**20
"""Room above the cap for a rank that ran out of memory to write why (``lift_cap_for_record``). Past a failed
allocation of 2.3 MiB the heap sits within that much of the cap, and building the failure record (peers' states,
the record's validation, the JSON line) allocates more: a rank's OOM could end with no record of its own, the run
then classified ``crashed`` on its peer's "terminated" (a capacity probe, 2026-11, issue 35)."""


def cap_process_memory(limit_bytes: int) -> None:
    """The one place the cap is applied: the soft limit at the cap, what every allocation of the run meets; the
    hard limit ``RECORD_ROOM_BYTES`` above it, which only ``lift_cap_for_record`` reaches, once the run failed."""
    resource.setrlimit(resource.RLIMIT_DATA, (limit_bytes, limit_bytes + RECORD_ROOM_BYTES))
    _libc_call("mallopt", M_MMAP_THRESHOLD, RETURNED_AT_FREE_BYTES)


def lift_cap_for_record() -> None:
    """After a failure: the soft limit up to the hard one, so the failure record can be built and written (a no-op
    without a cap). Nothing is measured after this."""
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


def current_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return int(psutil.Process().memory_info().rss)


def held_bytes(device: torch.device) -> int:
    """``current_bytes``, on CPU after returning the heap's free pages to the OS (where glibc can)."""
    if device.type != "cuda":
        _trim_heap()
    return current_bytes(device)


def _trim_heap() -> None:
    _libc_call("malloc_trim", 0)


def _libc_call(name: str, *args: int) -> None:
    try:
        getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)(*args)
    except (OSError, AttributeError):  # not glibc (musl, macOS): no such knob
        pass


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
