"""The on-disk side of ``ds_bench.measure.checkpoint``: tag folders, the completion marker, what a save wrote,
and removing what a failed save left.

``DIR/global_step<k>/`` (DeepSpeed's tag naming) holds the engine's files and, once every rank has
finished writing, ``ds_bench_checkpoint.json``: the marker rank 0 writes (whole, by rename) with the
step, what a resume must match, the save's figures and the API. A tag folder without a valid marker
is incomplete: never resumed from, and removed when the save that made it fails. A tag a run would
write must not exist yet (``check_target``): ds_bench overwrites no checkpoint, and a first write
is what a training job's save costs.
"""

from __future__ import annotations

import json
import os
import re
import shutil

from ds_bench.config import preflight
from ds_bench.errors import UserError

MARKER = "ds_bench_checkpoint.json"


_RANK_FILES = (re.compile(r"zero_pp_rank_(\d+)_"), re.compile(r"(?:^|/)__(\d+)_\d+\.distcp$"),
               re.compile(r"^offloaded_tensors/rank(\d+)/"))
"""Which rank wrote a file, by name: DeepSpeed's ZeRO shards, torch DCP's, offloaded tensors."""


def bytes_per_rank(files: dict[str, int], world_size: int) -> dict[str, int]:
    """Bytes written by each rank (keys as in the JSON record), from relative file names and sizes."""
    out = {str(r): 0 for r in range(world_size)}
    for name, size in files.items():
        rank = str(next((int(m.group(1)) for p in _RANK_FILES if (m := p.search(name))), 0))
        out[rank] = out.get(rank, 0) + size
    return out


def tag_for(step: int) -> str:
    return f"global_step{step}"


def read_marker(tag_dir: str) -> dict | None:
    """The marker of a complete tag folder; None if it is missing, unreadable or not this folder's."""
    try:
        with open(os.path.join(tag_dir, MARKER)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return None
    ok = isinstance(marker, dict) and marker.get("tag") == os.path.basename(tag_dir)
    return marker if ok and isinstance(marker.get("step"), int) else None


def write_marker(tag_dir: str, marker: dict) -> None:
    _write_atomic(os.path.join(tag_dir, MARKER), json.dumps(marker, indent=1))


def newest_complete(folder: str) -> dict | None:
    """The marker of the complete checkpoint with the highest step in ``folder``; None if none."""
    names = os.listdir(folder) if os.path.isdir(folder) else []
    markers = [m for name in names if (m := read_marker(os.path.join(folder, name)))]
    return max(markers, key=lambda m: m["step"], default=None)


def resumable(folder: str) -> dict:
    """The marker of the checkpoint --resume ``folder`` names: its newest complete one."""
    if not os.path.isdir(folder):
        raise UserError(f"--resume {folder}: not a folder; expected the --checkpoint DIR of an earlier run")
    marker = newest_complete(folder)
    if marker is None:
        raise UserError(f"--resume {folder}: no complete checkpoint in it; expected global_step<k>/{MARKER}, which "
                        "ds-bench run --checkpoint DIR writes once a save has finished")
    return marker


def list_files(tag_dir: str) -> dict[str, int]:
    """Relative path -> size of every file in ``tag_dir`` as this rank sees it, the marker left out."""
    out = {}
    for root, _, names in os.walk(tag_dir):
        for name in names:
            path = os.path.join(root, name)
            if name != MARKER and os.path.isfile(path):
                out[os.path.relpath(path, tag_dir)] = os.path.getsize(path)
    return out


def check_target(folder: str, tags: list[str]) -> list[str]:
    """Check that checkpoints ``tags`` can be saved in ``folder`` (a ``UserError`` naming --checkpoint);
    returns the folders that do not exist yet, ``folder`` first: what ds_bench creates."""
    flag = f"--checkpoint {folder}"
    if os.path.lexists(folder) and not os.path.isdir(folder):
        raise UserError(f"{flag}: is not a folder; expected a folder to save checkpoints in (created if missing)")
    preflight.check_folder_writable(folder, flag)
    existing = [tag for tag in tags if os.path.lexists(os.path.join(folder, tag))]
    if existing:
        raise UserError(f"{flag}: {existing[0]} already exists; ds_bench overwrites no checkpoint: give a new "
                        "folder or remove it")
    created, path = [], os.path.abspath(folder)
    while not os.path.lexists(path):
        created.append(path)
        path = os.path.dirname(path)
    return created


def free_bytes(folder: str) -> int | None:
    """Free bytes on ``folder``'s file system, for the message of a failed save; None if unknown."""
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def discard(folder: str, tag: str) -> None:
    """Remove a tag folder that is not complete, and repoint (or remove) a ``latest`` file naming it."""
    if read_marker(os.path.join(folder, tag)) is None:
        shutil.rmtree(os.path.join(folder, tag), ignore_errors=True)
    latest = os.path.join(folder, "latest")
    try:
        with open(latest) as f:
            if f.read().strip() != tag:
                return
        newest = newest_complete(folder)
        if newest is None:
            os.unlink(latest)
        else:
            _write_atomic(latest, newest["tag"])
    except OSError:
        pass


def remove_created(created: list[str]) -> None:
    """Remove ``created[0]`` (a folder this run made) with its contents unless it holds a complete
    checkpoint, then each parent this run made while it is empty."""
    if not created or newest_complete(created[0]) is not None:
        return
    shutil.rmtree(created[0], ignore_errors=True)
    for parent in created[1:]:
        try:
            os.rmdir(parent)
        except OSError:
            break


def _write_atomic(path: str, text: str) -> None:
    """Write ``text`` whole or not at all: a temporary file renamed over ``path``."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
