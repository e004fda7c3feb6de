"""What the GPU tier's tests share: a ``ds-bench`` command run into the tier's one folder (the ``gpu_out`` fixture,
``make gpu-check``'s folder), and the checks every CUDA run must pass, whatever else its test asserts."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from ds_bench.report.gpu_figures import tag
from tests.conftest import OFFLINE, ds_bench, explain, records


def gpu_run(out: Path, name: str, argv: tuple[str, ...], timeout: float = 300, **env: str) -> dict:
    """``ds-bench run ARGV --results OUT/NAME.jsonl --tag gpu-check:NAME`` (one process, one rank); exit 0; the
    newest record of that file, checked by ``check_cuda_run``."""
    results = out / f"{name}.jsonl"
    proc = ds_bench("run", *argv, "--results", str(results), "--tag", tag(name), timeout=timeout, **OFFLINE, **env)
    assert proc.returncode == 0, explain(proc)
    record = records(results)[-1]
    check_cuda_run(record)
    return record


def gpu_command(out: Path, name: str, argv: tuple[str, ...], timeout: float = 300) -> subprocess.CompletedProcess:
    """``ds-bench ARGV --results OUT/NAME.jsonl`` (roofline, comm, capacity); exit 0."""
    proc = ds_bench(*argv, "--results", str(out / f"{name}.jsonl"), timeout=timeout, **OFFLINE)
    assert proc.returncode == 0, explain(proc)
    return proc


def check_cuda_run(r: dict) -> None:
    """What only a CUDA run records: the device and its versions, nccl, the caching allocator's peaks (allocated,
    reserved), every phase of a step from CUDA events (one synchronize a step)."""
    assert r["status"] == "ok" and r["hardware"]["device_type"] == "cuda" and r["backend"] == "nccl", r.get("error")
    assert r["versions"]["cuda"] and r["versions"]["nccl"], r["versions"]
    m = r["metrics"]
    assert m["peak_mem_kind"] == "allocated" and m["peak_mem_reserved_bytes"] >= m["peak_mem_bytes"] > 0
    assert (m["timing_mode"], m["syncs_per_step"]) == ("step", 1)
    phases = m["breakdown_ms_median"]
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["optimizer"] >= 0, phases
    assert m["samples_per_s"] > 0 and all(math.isfinite(x) for x in m["loss_curve"])


def check_mfu(r: dict) -> None:
    """Model FLOPs, TFLOP/s and an MFU from the peak table (a GPU it lacks: no MFU, and the note says how to get
    one)."""
    m = r["metrics"]
    assert m["model_flops_per_step"] > 0 and m["tflops_per_device"] > 0
    if m["peak_tflops"] is not None:
        assert 0 < m["mfu"] < 1 and m["mfu"] == pytest.approx(m["tflops_per_device"] / m["peak_tflops"])
    else:
        assert m["mfu"] is None and "--peak-tflops" in m["mfu_note"]


def check_vs_measured(r: dict, out: Path) -> None:
    """A run beside a ``ds-bench roofline`` record of its host: its TFLOP/s against the measured ceiling too (none
    there, e.g. the roofline test failed or was not selected: nothing to check)."""
    if not (out / "roofline.jsonl").exists():
        return
    m = r["metrics"]
    assert m["measured_tflops"] > 0, m["measured_note"]
    assert 0 < m["mfu_vs_measured"] < 1 and m["mfu_vs_measured"] == pytest.approx(m["tflops_per_device"]
                                                                                   / m["measured_tflops"])
