"""Built CPU ops kept by what they are built from, so that a new environment of the same versions
loads them instead of compiling them again: pip's wheel cache, for DeepSpeed's JIT ops.

torch's build folder for an op is per environment (``ds_bench.machine.toolchain``: its build file
embeds the environment's include paths), so every new checkout or venv compiled DeepSpeed's CPU ops
again (1 min 28 s for both on 2 AMD EPYC cores, measured) although nothing they are built from had
changed. The store keys a built ``.so`` by what does determine it (``op_key``): the op's name, the
contents of its sources and headers, the torch, DeepSpeed and Python versions, the CPU (DeepSpeed
builds CPU ops with ``-march=native``) and the compiler. ``ds_bench.machine.jit_ops`` loads from it
before building and fills it after. CPU ops only: a CUDA op also depends on the GPU architectures it
was built for, which torch's build checks and this key would not.

Where: ``$DS_BENCH_OP_STORE``, else ``~/.cache/ds_bench/ops``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping
from types import ModuleType

from ds_bench.machine.toolchain import cpu_identity, read_text

HEADER_SUFFIXES = (".h", ".hpp", ".cuh")


def op_key(op_name: str, source_digest: str, versions: Iterable[str], cpu: str, compiler: str) -> str:
    """The store's name for one build (pure): equal exactly when every input a CPU build depends on is."""
    digest = hashlib.sha256()
    for part in (op_name, source_digest, *versions, cpu, compiler):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def stored_path(root: str, op_name: str, key: str) -> str:
    """Where the store keeps ``op_name`` built under ``key`` (pure); the file keeps the module's name."""
    return os.path.join(root, f"{op_name}-{key}", f"{op_name}.so")


def store_root(env: Mapping[str, str], home: str) -> str:
    """``$DS_BENCH_OP_STORE``, else ``~/.cache/ds_bench/ops`` (pure)."""
    return env.get("DS_BENCH_OP_STORE") or os.path.join(home, ".cache", "ds_bench", "ops")


def files_digest(paths: Iterable[str]) -> str:
    """SHA-256 over the files' names (as given, sorted) and contents: what a build compiles."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def headers_under(folders: Iterable[str]) -> list[str]:
    """The header files under each existing folder (recursive)."""
    found = []
    for folder in folders:
        for parent, _, names in os.walk(folder):
            found += [os.path.join(parent, n) for n in names if n.endswith(HEADER_SUFFIXES)]
    return found


@functools.lru_cache(maxsize=1)
def compiler_identity() -> str:
    """The first line of ``$CXX --version`` (torch builds with ``$CXX``, else ``c++``); empty if it fails."""
    try:
        out = subprocess.run([os.environ.get("CXX") or "c++", "--version"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.splitlines()[0] if out else ""


def path_for(op_name: str, sources: list[str], include_folders: list[str], versions: tuple[str, ...]) -> str:
    """Where this machine's store keeps ``op_name`` built from these sources with these versions."""
    python = sys.implementation.cache_tag or sys.version
    key = op_key(op_name, files_digest(sources + headers_under(include_folders)), (*versions, python),
                 cpu_identity(read_text("/proc/cpuinfo")), compiler_identity())
    return stored_path(store_root(os.environ, os.path.expanduser("~")), op_name, key)


def keep(built: str, dest: str) -> None:
    """Copy a built op into the store, whole or not at all (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    partial = f"{dest}.{os.getpid()}.partial"
    shutil.copyfile(built, partial)
    os.chmod(partial, 0o755)
    os.replace(partial, dest)


def load(op_name: str, path: str) -> ModuleType:
    """Import a stored op as torch's build would (the module is named after the op); raises
    ImportError or OSError for a file that is not a loadable extension of this interpreter."""
    spec = importlib.util.spec_from_file_location(op_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
