"""Which ninja and which op-build folder this environment's DeepSpeed JIT builds use (pure).

Two ninja versions write incompatible ``.ninja_log`` files, and two environments sharing one build
folder rebuild each other's ops (``ds_bench.machine.jit_ops`` says how this was measured), so every
process of one environment puts the ninja beside its interpreter first on PATH and builds into a
folder keyed by interpreter prefix, torch, DeepSpeed, ninja and CPU. ``ds_bench.machine.environ`` applies it.

The CPU is in the key because DeepSpeed builds its CPU ops with ``-march=native`` and an ISA define
(``__AVX512__`` / ``__AVX256__``): an op built on an AVX-512 Xeon dies with SIGILL on an AVX2 EPYC that
shares the home directory (clusters with mixed partitions; this project's machine image alternates).
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from importlib import metadata


def toolchain_env(env: Mapping[str, str], bindir: str, ninja_beside: bool, prefix: str,
                  versions: tuple[str, ...], home: str, cpu: str = "") -> dict[str, str]:
    """The PATH and TORCH_EXTENSIONS_DIR updates that make every process of one environment build
    with the same ninja into the same folder (pure: ``environ.pin_jit_toolchain`` applies them).

    ``versions`` are the torch and DeepSpeed versions; the folder name carries the ninja used and the
    ``cpu`` (``cpu_identity``) too.
    """
    updates: dict[str, str] = {}
    path = env.get("PATH", "")
    entries = path.split(os.pathsep) if path else []
    if ninja_beside and entries[:1] != [bindir]:
        updates["PATH"] = os.pathsep.join([bindir, *entries])
    ninja = os.path.join(bindir, "ninja") if ninja_beside else "ninja-on-PATH"
    if not env.get("TORCH_EXTENSIONS_DIR"):
        key = "\0".join((os.path.abspath(prefix), *versions, ninja, cpu))
        digest = hashlib.sha256(key.encode()).hexdigest()[:10]
        py = f"py{sys.version_info.major}{sys.version_info.minor}"
        updates["TORCH_EXTENSIONS_DIR"] = os.path.join(home, ".cache", "torch_extensions", f"ds_bench-{py}-{digest}")
    return updates


def this_environment_toolchain(env: Mapping[str, str]) -> dict[str, str]:
    """``toolchain_env`` for this interpreter (reads installed versions, not module imports)."""
    bindir = os.path.dirname(os.path.abspath(sys.executable))
    versions = tuple(_version(p) for p in ("torch", "deepspeed"))
    return toolchain_env(env, bindir, os.path.isfile(os.path.join(bindir, "ninja")), sys.prefix, versions,
                         os.path.expanduser("~"), cpu_identity(read_text("/proc/cpuinfo")))


def cpu_identity(cpuinfo: str) -> str:
    """The CPU a native build targets, from ``/proc/cpuinfo`` text (pure): its first model name and
    ISA flags (sorted); empty where the file says neither (non-Linux)."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in ("model name", "flags") and name.strip() not in fields:
            fields[name.strip()] = value.strip()
    flags = " ".join(sorted(fields.get("flags", "").split()))
    return f"{fields.get('model name', '')}|{flags}" if fields else ""


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"
