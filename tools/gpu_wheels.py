"""``make gpu-wheels``: the Python packages a lent GPU machine lacks, as wheels in ``.gpu/wheels`` (ignored by git),
for ``make gpu-check`` to install there (docs/testing.md, "The GPU tier: make gpu-check")::

    .venv/bin/python tools/gpu_wheels.py [--dest .gpu/wheels]

The GPU machine runs Python 3.12 on x86-64 with torch, transformers, mpi4py, psutil, scipy, tabulate and pytest
installed, and reaches no package registry; it lacks DeepSpeed and what DeepSpeed, ds_bench and the tests import
beyond that (``CARRIED``). Each is taken at the version this environment has (what the CPU suite runs with):
pure-Python ones as ``py3-none-any`` wheels (``pip download``; DeepSpeed and python-hostlist, published as source
only, built here with ``pip wheel``, with no compiled op: DeepSpeed builds its CUDA ops on the GPU machine at first
use), compiled ones for CPython 3.12 manylinux x86-64. Fails, naming it, on a wheel of another platform, or when all
of them pass ``LIMIT_BYTES`` (the device tool carries at most 64 MiB of tree and carried paths together).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CARRIED = ("deepspeed", "hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
           "typing-extensions", "python-hostlist", "jsonschema", "jsonschema-specifications", "referencing",
           "rpds-py", "attrs")
"""DeepSpeed and its pydantic and hjson; python-hostlist (``ds_bench.cluster.slurm``); jsonschema and its own
(``tests/conftest.py`` checks every record against the schema). typing-extensions and attrs are on the GPU machine
already, perhaps older than pydantic and jsonschema want: pip there installs them only if so."""
BUILT = ("deepspeed", "python-hostlist")
"""Published as source only: built into a wheel here."""
PLATFORM = ("--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
            "--platform", "manylinux2014_x86_64")
LIMIT_BYTES = 48 * 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_wheels", description=__doc__.splitlines()[0])
    p.add_argument("--dest", default=str(REPO / ".gpu" / "wheels"))
    dest = Path(p.parse_args(argv).dest)
    dest.mkdir(parents=True, exist_ok=True)
    pins = {name: metadata.version(name) for name in CARRIED}
    for old in dest.glob("*.whl"):  # one version of each: two would stop the install there
        old.unlink()
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    fetched = [f"{name}=={pins[name]}" for name in CARRIED if name not in BUILT]
    built = [f"{name}=={pins[name]}" for name in BUILT]
    for step in ([*pip, "download", "--no-deps", *PLATFORM, "-d", str(dest), *fetched],
                 [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(dest), *built]):
        if subprocess.run(step).returncode != 0:
            print(f"gpu-wheels: failed: {' '.join(step)}", file=sys.stderr)
            return 1
    wheels = sorted(dest.glob("*.whl"))
    problems = [w.name for w in wheels if not fits_the_gpu_machine(w.name)]
    total = sum(w.stat().st_size for w in wheels)
    for w in wheels:
        print(f"  {w.stat().st_size / 2**20:6.2f} MiB  {w.name}")
    print(f"gpu-wheels: {len(wheels)} wheels, {total / 2**20:.1f} MiB in {dest}")
    if problems or total > LIMIT_BYTES or len(wheels) != len(CARRIED):
        print(f"gpu-wheels: not for the GPU machine: {', '.join(problems) or '-'}; {total / 2**20:.1f} MiB (at most "
              f"{LIMIT_BYTES / 2**20:.0f}); {len(wheels)} wheels for {len(CARRIED)} packages", file=sys.stderr)
        return 1
    return 0


def fits_the_gpu_machine(filename: str) -> bool:
    """A wheel CPython 3.12 on x86-64 Linux installs: pure Python 3, or compiled for cp312 manylinux x86_64."""
    python, abi, platform = filename.removesuffix(".whl").split("-")[-3:]
    if platform == "any":
        return abi == "none" and any(t.startswith("py3") for t in python.split("."))
    return "cp312" in python.split(".") and abi in ("cp312", "abi3") and all(
        p.startswith("manylinux") and p.endswith("x86_64") for p in platform.split("."))


if __name__ == "__main__":
    sys.exit(main())
