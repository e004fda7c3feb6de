"""Pre-flight: what ``ds-bench run`` checks on every rank before the process group is joined.

Bad input found after joining costs a JIT build and ``deepspeed.initialize``, and leaves the other
ranks waiting up to the dist timeout; found here it is one ``UserError`` line, exit 2 on every
rank, and nothing recorded. ``run.run_benchmark`` calls ``check`` just before
``runtime.init_distributed``, when the world size (rendezvous) and the micro-batch (resolved
DeepSpeed config) are known. Checked:

- The results path (``check_results_path``): not a folder; an existing file opens for appending;
  otherwise the nearest existing ancestor of its folder is a folder in which a file can be created
  (a probe file, removed at once) and whose file system has free space. Nothing is left behind:
  missing folders are not created here (``results.append_record`` creates them at the end). A
  real create is the only test that holds for root, who ignores permission bits, and on read-only
  mounts or pseudo file systems such as /proc.
- The data (``Workload.load_data``): read, decoded or tokenized, and counted against
  world size x micro-batch. The workload keeps what it loaded for ``batches``.
"""

from __future__ import annotations

import os
import tempfile

from ds_bench.errors import UserError


def check(cfg, workload, world_size: int, micro_batch: int) -> None:
    """Every pre-join check of one run: results path first (cheap), then the data."""
    check_results_path(cfg.results)
    workload.load_data(world_size, micro_batch)


def check_results_path(path: str) -> None:
    """A UserError naming ``--results`` unless a results line can be appended to ``path`` later."""
    flag = f"--results {path}"
    if os.path.isdir(path):
        raise UserError(f"{flag}: is a folder; give a file path such as {os.path.join(path, 'results.jsonl')}")
    if os.path.lexists(path):
        _check_appendable(path, flag)
        return
    check_folder_writable(os.path.dirname(os.path.abspath(path)), flag)


def check_folder_writable(folder: str, flag: str) -> None:
    """A UserError naming ``flag`` unless files can be created in ``folder``, or, where it does not
    exist yet, in its nearest existing ancestor (to create it in); nothing is created here."""
    folder = os.path.abspath(folder)
    ancestor = nearest_existing(folder)
    if not os.path.isdir(ancestor):
        raise UserError(f"{flag}: {ancestor} is not a folder")
    where = folder if ancestor == folder else f"{ancestor} (to create {folder} in)"
    _probe_create(ancestor, f"{flag}: cannot create files in {where}")
    _check_free_space(ancestor, flag)


def nearest_existing(path: str) -> str:
    """``path`` itself if it exists, else its nearest existing ancestor (``/`` at worst)."""
    path = os.path.abspath(path)
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    return path


def _check_appendable(path: str, flag: str) -> None:
    """Open for appending (O_NONBLOCK: a FIFO must not hang us) and close: nothing is written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
    except OSError as e:
        raise UserError(f"{flag}: cannot open for appending: {e.strerror}") from None
    os.close(fd)
    _check_free_space(os.path.dirname(os.path.abspath(path)), flag)


def _probe_create(folder: str, message: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(prefix=".ds-bench-probe-", dir=folder)
    except OSError as e:
        raise UserError(f"{message}: {e.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def _check_free_space(folder: str, flag: str) -> None:
    """A file system with no free block cannot take the record (root may use the reserved ones)."""
    st = os.statvfs(folder)
    free = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    if free == 0:
        raise UserError(f"{flag}: no space left on the file system of {folder}")
