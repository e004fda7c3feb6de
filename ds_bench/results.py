"""The results record: one JSON line per run, appended atomically by rank 0.

Atomic means a whole line or nothing: the line is written with one ``write`` on an ``O_APPEND``
descriptor under an exclusive ``flock`` and fsync'ed, so concurrent runs sharing a results file
never interleave and a killed run leaves no half line.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import socket
import subprocess
import time
import uuid
from importlib import metadata

import torch


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def append_record(path: str, record: dict) -> None:
    line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            written = os.write(fd, line)
        except OSError:
            written = -1
        if written != len(line):  # disk full or similar: leave no half line behind
            os.ftruncate(fd, start)
            raise OSError(f"{path}: could not append a whole results line")
        os.fsync(fd)
    finally:
        os.close(fd)


def read_records(path: str) -> list[dict]:
    """Run records of a results file (other kinds, e.g. ``doctor --json`` lines, are skipped)."""
    from ds_bench.errors import UserError

    out = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not a JSON line ({e.msg}); was the file edited by hand?") from None
            if isinstance(record, dict) and "workload" in record:
                out.append(record)
    return out


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for package in ("deepspeed", "transformers", "datasets", "mpi4py"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    out["cuda"] = torch.version.cuda
    out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return out


def git_sha() -> str | None:
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def hardware(device: torch.device) -> dict:
    if device.type == "cuda":
        return {"device": torch.cuda.get_device_name(device), "device_type": "cuda"}
    return {"device": platform.processor() or platform.machine(), "device_type": device.type,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def base_record(run_id: str, run_cfg: dict) -> dict:
    return {"run_id": run_id, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
            "versions": versions(), "git_sha": git_sha(), "config": run_cfg}
