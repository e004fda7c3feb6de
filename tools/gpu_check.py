"""``make gpu-check``: the GPU tier in one command, for the rare session that is lent a GPU (docs/testing.md, "The GPU
tier: make gpu-check")::

    python3 tools/gpu_check.py [--out FOLDER] [--budget 540] [--workers 4]

1. No CUDA GPU (``torch.cuda.is_available()`` false, or no torch): one line, exit 0, nothing written.
2. DeepSpeed or another carried package not importable and ``.gpu/wheels`` there (``make gpu-wheels`` fills it on a
   machine with the registry; the GPU machine has none): ``pip install --no-index`` of the carried wheels into this
   Python (into ``.gpu/site`` when this Python's own environment refuses).
3. ``pytest -m gpu``: ``tests/test_gpu.py`` 4 tests at a time (checks: no figure is taken from them), then
   ``tests/test_gpu_timed.py`` alone (the figures), every test writing its records into FOLDER (``DS_BENCH_GPU_OUT``;
   default ``results/gpu-check-<UTC date>``); all within ``--budget`` seconds: past it pytest is stopped, and what was
   recorded is kept and still tabled.
4. FOLDER/figures.md (``ds_bench.report.gpu_figures``: the date, the command, the GPU, driver and versions, then the
   figures) and FOLDER/report.html (``ds-bench report --html``) from FOLDER's records; machine.json (nvidia-smi's GPU,
   driver and memory), pytest's logs and JUnit files beside them.

Exit 0 when every part passed, else 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WHEELS = REPO / ".gpu" / "wheels"
SITE = REPO / ".gpu" / "site"
NEEDED = ("deepspeed", "pydantic", "hjson", "hostlist", "jsonschema")
"""Modules the GPU tier imports that a bare GPU machine may lack (what ``make gpu-wheels`` carries)."""
PHASES = (("checks", "tests/test_gpu.py", True), ("timed", "tests/test_gpu_timed.py", False))
"""(name, test file, several at a time): the timed runs have the GPU to themselves."""
AFTER_S = 25.0
"""Seconds of the budget kept for the figures page and the HTML report."""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    why = no_gpu()
    if why:
        print(f"gpu-check: skipped: {why}; nothing run, nothing written", flush=True)
        return 0
    started = time.monotonic()
    installed = install_missing()
    if installed is None:
        return 1
    sys.path[:0] = [*installed, str(REPO)]  # ds_bench and what was installed, for the figures page
    out = out_folder(args.out)
    env = child_env(out, installed)
    notes, ok = [], True
    for name, path, parallel in PHASES:
        left = args.budget - (time.monotonic() - started) - AFTER_S
        outcome, passed = run_pytest(name, path, out, env, left, args.workers if parallel else 0)
        notes.append(f"pytest {path}{outcome}")
        ok &= passed
    notes.append(f"wall {time.monotonic() - started:.0f} s of a {args.budget:.0f} s budget")
    ok &= finish(out, env, nvidia_smi(), notes, command_line(argv))
    print(f"gpu-check: {'passed' if ok else 'FAILED'}; figures {out}/figures.md, page {out}/report.html", flush=True)
    return 0 if ok else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("DS_BENCH_GPU_OUT") or None,
                   help="folder of every record, log and page (default results/gpu-check-<UTC date>)")
    p.add_argument("--budget", type=float, default=540.0, help="seconds for the whole check (default 540)")
    p.add_argument("--workers", type=int, default=4, help="check tests at a time (default 4)")
    return p.parse_args(argv)


def no_gpu() -> str | None:
    """Why there is nothing to check here; None when a CUDA GPU is there."""
    try:
        import torch
    except ImportError as e:
        return f"no CUDA GPU: {sys.executable} cannot import torch ({e})"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (torch.cuda.is_available() is False)"
    return None


def install_missing() -> list[str] | None:
    """Install the carried wheels if a needed module is missing; the extra import paths the children need (empty:
    none), or None when something stays missing (said why)."""
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if not missing:
        return []
    wheels = sorted(WHEELS.glob("*.whl"))
    if not wheels:
        print(f"gpu-check: {', '.join(missing)} not importable and no wheels in {WHEELS}: run `make gpu-wheels` on a "
              "machine with the package registry and carry .gpu/wheels (docs/testing.md)", flush=True)
        return None
    names = sorted({w.name.split("-")[0] for w in wheels})
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-index",
           "--find-links", str(WHEELS)]
    env = {**os.environ, "PIP_ROOT_USER_ACTION": "ignore"}
    print(f"gpu-check: installing {', '.join(names)} from {WHEELS} ({', '.join(missing)} missing)", flush=True)
    paths = []
    if subprocess.run([*pip, *names], env=env).returncode != 0:  # e.g. an environment that refuses installs
        print(f"gpu-check: installing into {SITE} instead", flush=True)
        if subprocess.run([*pip, "--no-deps", "--target", str(SITE), *map(str, wheels)], env=env).returncode != 0:
            return None
        paths = [str(SITE)]
    check = subprocess.run([sys.executable, "-c", "import " + ", ".join(NEEDED)], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(REPO)])})
    if check.returncode != 0:
        print(f"gpu-check: after the install, still not importable:\n{check.stderr[-2000:]}", flush=True)
        return None
    return paths


def out_folder(given: str | None) -> Path:
    """``given``, else ``results/gpu-check-<UTC date>``, ``-2``, ``-3``... when that one holds a check already."""
    if given:
        folder = Path(given)
    else:
        base = REPO / "results" / f"gpu-check-{time.strftime('%Y-%m-%d', time.gmtime())}"
        folder, n = base, 1
        while folder.exists() and any(folder.iterdir()):
            n += 1
            folder = base.with_name(f"{base.name}-{n}")
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve()


def child_env(out: Path, paths: list[str]) -> dict[str, str]:
    extra = [*paths, str(REPO), *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])]
    return {**os.environ, "DS_BENCH_GPU_OUT": str(out), "PYTHONPATH": os.pathsep.join(extra), "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_pytest(name: str, path: str, out: Path, env: dict, left_s: float, workers: int) -> tuple[str, bool]:
    """One pytest of the tier, its output to the console and to FOLDER/pytest-NAME.log; (what became of it, as
    the page's note goes on after the file's name, passed)."""
    if left_s <= 0:
        return ": not run, the budget was spent", False
    junit = out / f"pytest-{name}.xml"
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", path, "-v", "-p", "no:cacheprovider", "--durations=0",
            "--junitxml", str(junit)]
    at_once = workers > 1 and importlib.util.find_spec("xdist") is not None
    argv += ["-n", str(workers), "--dist", "load"] if at_once else []
    started = time.monotonic()
    with open(out / f"pytest-{name}.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        copier = threading.Thread(target=_tee, args=(proc.stdout, log), daemon=True)
        copier.start()
        try:
            code = proc.wait(timeout=left_s)
        except subprocess.TimeoutExpired:
            _stop(proc)
            code = None
        copier.join(timeout=10)
    took, counts = time.monotonic() - started, _counts(junit)
    how = f" ({workers} at a time)" if at_once else ""
    if code is None:
        return f"{how}: stopped at the budget after {took:.0f} s{counts and f' ({counts})'}", False
    return f"{how}: {counts or f'exit {code}'} in {took:.0f} s", code == 0


def _tee(stream, log) -> None:
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        log.write(line)


def _stop(proc: subprocess.Popen) -> None:
    """pytest and every run it started (its own session), SIGTERM then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=grace)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def _counts(junit: Path) -> str:
    """``9 passed, 1 failed, 0 skipped`` from pytest's JUnit file; empty when it wrote none."""
    try:
        suite = ElementTree.parse(junit).getroot()
    except (OSError, ElementTree.ParseError):
        return ""
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
    return f"{tests - failed - errors - skipped} passed, {failed + errors} failed, {skipped} skipped"


def nvidia_smi() -> dict:
    """The GPU's name, driver and memory as nvidia-smi gives them (what no record holds); empty without it."""
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True, text=True,
                              timeout=30).stdout.splitlines()[0]
        name, driver, memory = (part.strip() for part in line.split(","))
        return {"gpu": name, "driver": driver, "memory_mib": int(float(memory))}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {}


def command_line(argv: list[str] | None) -> str:
    if os.environ.get("MAKELEVEL"):
        return "make gpu-check"
    return " ".join(["python3 tools/gpu_check.py", *(sys.argv[1:] if argv is None else argv)])


def read_records(out: Path) -> list[dict]:
    found = []
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a stopped run: not a record
                continue
    return found


def finish(out: Path, env: dict, machine: dict, notes: list[str], command: str) -> bool:
    """machine.json, figures.md and report.html from FOLDER's records; whether ``ds-bench report --html`` made the
    page."""
    from ds_bench.report.gpu_figures import page

    (out / "machine.json").write_text(json.dumps(machine, indent=1) + "\n")
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    (out / "figures.md").write_text(page(read_records(out), date=date, command=command, machine=machine,
                                         notes=tuple(notes)))
    files = [str(p) for p in sorted(out.glob("*.jsonl")) if p.stat().st_size]
    if not files:
        print(f"gpu-check: no page: no records in {out}", flush=True)
        return False
    proc = subprocess.run([sys.executable, "-m", "ds_bench", "report", *files, "--html", str(out / "report.html")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        print(f"gpu-check: no page: ds-bench report --html exit {proc.returncode}\n{proc.stderr[-3000:]}", flush=True)
    return proc.returncode == 0


if __name__ == "__main__":
    sys.exit(main())
