"""The results file: typed records (``ds_bench.record.schema``) as JSON lines, appended atomically.

Atomic means a whole line or nothing: the line is written with one ``write`` on an ``O_APPEND``
descriptor under an exclusive ``flock`` and fsync'ed, so concurrent runs sharing a results file
never interleave and a killed run leaves no half line. A write the file system refuses part-way
(disk full, file-size limit) is cut back to the line's start and reported as one ``UserError`` line.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import platform
import socket
import subprocess
import time
import uuid
from importlib import metadata
from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from ds_bench.record.schema import Record, model_of

if TYPE_CHECKING:  # torch is imported where it is used: reading a results file needs none of it
    import torch

R = TypeVar("R", bound=Record)


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:8]


def append_record(path: str, record: Record) -> None:
    """Append ``record`` as one whole JSON line, or nothing: the keys its writer set, its ``kind``
    and ``schema_version`` (``Record.to_json_dict``).

    A write the file system cuts short (disk full, ``RLIMIT_FSIZE``, quota) is truncated back to the
    line's start and raised as a ``UserError`` naming the file and the reason, so the CLI reports
    it as one line and a non-zero exit rather than a traceback.
    """
    if not isinstance(record, Record):
        raise TypeError(f"append_record takes a record model (ds_bench.record.schema), not {type(record).__name__}")
    line = (json.dumps(record.to_json_dict(), sort_keys=True, default=str) + "\n").encode()
    parent = os.path.dirname(os.path.abspath(path))
    try:
        if not os.path.lexists(parent):  # a parent that is a file: let open say "Not a directory"
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        raise _append_error(path, e) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            _write_all(fd, line)
            os.fsync(fd)
        except OSError as e:
            os.ftruncate(fd, start)  # leave no half line behind
            raise _append_error(path, e) from None
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    """One ``write`` in the normal case; a short write is continued, so the error that cut it
    short (ENOSPC, EFBIG...) is the one raised."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:  # not expected of a regular file; never loop on it
            raise OSError(errno.EIO, "the file system accepted no bytes")
        view = view[written:]


def _append_error(path: str, e: OSError):
    from ds_bench.errors import UserError

    return UserError(f"{path}: could not append a whole results line: {e.strerror or e}")


def check_results_file(path: str, named: str = "") -> None:
    """A ``UserError`` unless ``path`` is an existing results file (a command reading one it is given);
    ``named``: how the command calls it (``BASE``), before the path in the message."""
    from ds_bench.errors import UserError

    where = f"{named} {path}" if named else path
    if os.path.isdir(path):
        raise UserError(f"{where}: is a folder; expected a results file (JSON lines)")
    if not os.path.isfile(path):
        raise UserError(f"{where}: no results file")


def read_records(path: str, kind: type[R] = Record, missing_ok: bool = False, start: int = 0) -> list[R]:
    """The records of ``kind`` (a model of ``ds_bench.record.schema``; default: every kind) in a results
    file, typed, in file order; lines of other kinds (and of kinds this version does not know) are
    skipped. ``missing_ok``: a file not written yet holds none. ``start``: a byte offset at a line's start
    (the file's size before a command appended to it): only the lines from there. A line that is not JSON,
    or one of ``kind`` that does not fit its model, is a ``UserError`` naming the line."""
    from ds_bench.errors import UserError

    if missing_ok and not os.path.isfile(path):
        return []
    out = []
    with open(path, "rb") as f:
        before = f.read(start).count(b"\n")  # line numbers stay the file's own
        rest = f.read()
        if start and not _at_line_start(f, start):  # an offset taken while a writer was mid-line: its next line
            cut = rest.find(b"\n") + 1
            before, rest = before + 1, rest[cut:] if cut else b""
        if rest and not rest.endswith(b"\n"):  # a writer on another node mid-line (appends are whole lines)
            rest = rest[:rest.rfind(b"\n") + 1]
        lines = [raw.decode("utf-8", errors="replace") for raw in rest.split(b"\n")]
        for lineno, line in enumerate(lines, before + 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{path}:{lineno}: not a JSON line ({e.msg}); was the file edited by hand?") from None
            model = model_of(data)
            if model is None or not issubclass(model, kind):
                continue
            try:
                out.append(model.model_validate(data))
            except ValidationError as e:
                raise UserError(f"{path}:{lineno}: not a valid {data.get('kind', 'run')} record: {_first_error(e)}") from None
    return out


def _at_line_start(f, offset: int) -> bool:
    f.seek(offset - 1)
    return f.read(1) == b"\n"


def _first_error(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{where}: {err['msg']}{more}"


def versions() -> dict:
    import torch

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
    import torch

    if device.type == "cuda":
        return {"device": torch.cuda.get_device_name(device), "device_type": "cuda"}
    return {"device": platform.processor() or platform.machine(), "device_type": device.type,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}


def base_record(run_id: str, run_cfg: dict) -> dict:
    """The ``schema.Stamped`` fields of a run, scaling or comm record: who wrote it, where, with what."""
    return {"run_id": run_id, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
            "versions": versions(), "git_sha": git_sha(), "config": run_cfg}
