"""Checkpoint I/O: what a checkpoint costs on the file system, and that a run resumes from it.

``--checkpoint DIR`` saves into ``DIR/global_step<k>`` (DeepSpeed's tag naming) after global step k:
once after the last step, or after every step that is a multiple of ``--checkpoint-every K``
(``save_steps``). The last checkpoint saved is then loaded back into the engine, which times reading
and proves it loads. ``--resume DIR`` loads the newest complete checkpoint in DIR before the first
step; the run's steps are then k+1, k+2, ... and each rank's data stream skips the k x accumulation
micro-batches it had consumed (``skip``).

Measured (rank 0's record; seconds of wall clock; GB = 1e9 bytes):
- time of a save or load: synchronize, barrier, the engine's call, synchronize, barrier, from the
  first barrier to the last (the slowest rank's I/O is inside). It is in no step time, and
  ``run_loop`` takes its ``after_step`` time out of the window's outside clock.
- bytes: the files in the tag folder (ds_bench's marker left out), every rank's listing gathered
  (node-local folders see only their node's files), attributed by name (``bytes_per_rank``):
  DeepSpeed's ``[bf16_]zero_pp_rank_{r}_mp_rank_00_{optim,model}_states.pt`` and torch DCP's
  ``__{r}_0.distcp``, NVMe offload's ``offloaded_tensors/rank{r}/`` to rank r; anything else
  (``mp_rank_00_model_states.pt``, ``.metadata``) to rank 0.
- GB/s: a rank's bytes / save time (per rank), all bytes / save time (aggregate); the record's
  figures take the median save time and the last save's bytes. Load: the tag's bytes / load time.

Engines need DeepSpeed's two calls, nothing else: ``save_checkpoint(dir, tag=, client_state=)`` and
``load_checkpoint(dir, tag=) -> (path, client_state)``. Only complete tag folders (with ds_bench's
marker, ``ds_bench.measure.checkpoint_disk``) are resumed from. client_state and marker carry the step and
what a resume must share (``MATCHED``), checked before the process group is joined and after loading.

Nothing is left that was not asked for: a save that fails removes its tag folder; a DIR ds_bench
created that holds no complete checkpoint at the end is removed; completed checkpoints are kept.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ds_bench.cluster import faults
from ds_bench.errors import UserError
from ds_bench.measure.checkpoint_disk import (
    bytes_per_rank,
    check_target,
    discard,
    free_bytes,
    list_files,
    remove_created,
    resumable,
    tag_for,
    write_marker,
)

CLIENT_KEY = "ds_bench"
MATCHED = {"workload": "--workload", "seed": "--seed", "world_size": "world size", "micro_batch": "micro-batch",
           "grad_accum": "gradient accumulation"}
"""What a resumed run must share with the saving run: the data stream and its skip depend on them."""


class CheckpointError(RuntimeError):
    """A save or load that failed; the run records it as its failure."""


def save_steps(start: int, steps: int, every: int | None) -> list[int]:
    """Global steps after which to save among ``start + 1 .. start + steps``: the last, or every
    multiple of ``every`` (warm-up steps included: a save is in no step time either way)."""
    if every is None:
        return [start + steps]
    return [s for s in range(start + 1, start + steps + 1) if s % every == 0]


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def figures(saves: list[dict], load: dict | None) -> dict:
    """The record's figures from the saves (``tag, step, save_s, bytes_total, bytes_per_rank`` each)
    and the load-back (``tag, load_s, bytes``)."""
    out = {"tags": [s["tag"] for s in saves], "steps": [s["step"] for s in saves],
           "save_s": [s["save_s"] for s in saves], "units": "seconds; GB = 1e9 bytes"}
    if saves:
        median, last = statistics.median(out["save_s"]), saves[-1]
        per_rank = [gbps(b, median) for b in last["bytes_per_rank"].values()]
        out.update(save_s_median=median, bytes_total=last["bytes_total"], bytes_per_rank=last["bytes_per_rank"],
                   save_GBps=gbps(last["bytes_total"], median), save_GBps_per_rank_min=min(per_rank),
                   save_GBps_per_rank_median=statistics.median(per_rank))
    if load:
        out.update(load_tag=load["tag"], load_s=load["load_s"], load_GBps=gbps(load["bytes"], load["load_s"]))
    return out


def mismatch(saved: dict, expected: dict) -> str | None:
    """Why a checkpoint saved with ``saved`` cannot continue a run of ``expected``; None if it can."""
    for key, value in expected.items():
        if saved.get(key) != value:
            return (f"was saved with {MATCHED.get(key, key)} {saved.get(key)}, this run has {value}; a resumed run "
                    f"needs the same {', '.join(MATCHED.values())}")
    return None


def api_of(engine) -> str:
    return ("deepspeed save_checkpoint" if type(engine).__module__.startswith("deepspeed")
            else "torch.distributed.checkpoint")


def skip(batches: Iterator, n: int) -> Iterator:
    """``batches`` past its first ``n`` items (the micro-batches a resumed run has already used)."""
    for _ in range(n):
        next(batches)
    return batches


def timed(op: Callable, sync: Callable[[], None], barrier: Callable[[], None]) -> tuple[float, object]:
    """``op()``'s result and its wall time from the barrier before it to the barrier after it."""
    sync()
    barrier()
    start = time.perf_counter()
    out = op()
    sync()
    barrier()
    return time.perf_counter() - start, out


@dataclass(frozen=True)
class Binding:
    """What a Checkpointer does its I/O with, once the engine exists."""

    engine: object
    sync: Callable[[], None]
    barrier: Callable[[], None]
    gather: Callable[[object], list]
    """Every rank's object, in rank order (``runtime.gather``)."""
    rank: int
    world_size: int


@dataclass
class Checkpointer:
    """One run's checkpointing: resolved before the process group is joined (``resolve``), bound to the
    engine by ``attach``. Without --checkpoint or --resume every method does nothing."""

    dir: str | None = None
    every: int | None = None
    schedule: list[int] = field(default_factory=list)
    resume_dir: str | None = None
    resume_marker: dict | None = None
    expected: dict = field(default_factory=dict)
    created: list[str] = field(default_factory=list)
    """Folders this run creates, DIR first, then its missing parents."""
    start: int = 0
    saves: list[dict] = field(default_factory=list)
    load: dict | None = None
    resumed: dict | None = None
    io: Binding | None = None

    def attach(self, engine, **io) -> int:
        """Bind the engine (and ``Binding``'s other fields), create DIR, resume when asked; returns the
        global step the run starts after."""
        self.io = Binding(engine, **io)
        if self.dir:
            os.makedirs(self.dir, exist_ok=True)
        if self.resume_marker:
            self._resume()
        return self.start

    def after_step(self, done: int) -> None:
        """``run_loop``'s callback after this run's step ``done``: save when the schedule says so."""
        if self.dir and self.start + done in self.schedule:
            self.save(self.start + done)

    def save(self, step: int) -> None:
        io, tag = self.io, tag_for(step)
        meta = {**self.expected, "step": step, "tag": tag}
        try:
            seconds, _ = self._timed(lambda: io.engine.save_checkpoint(self.dir, tag=tag, client_state={CLIENT_KEY: meta}))
            files = {k: v for listing in io.gather(list_files(os.path.join(self.dir, tag))) for k, v in listing.items()}
            per_rank = bytes_per_rank(files, io.world_size)
            entry = {"tag": tag, "step": step, "save_s": seconds, "bytes_total": sum(per_rank.values()),
                     "bytes_per_rank": per_rank}
            if io.rank == 0:
                write_marker(os.path.join(self.dir, tag), {**meta, **entry, "api": api_of(io.engine)})
            io.barrier()  # every rank starts the next step together: no rank's step holds rank 0's marker write
        except BaseException as e:
            free = free_bytes(self.dir)  # before the partial files go: what the save left free
            with faults.deferred():
                discard(self.dir, tag)
            if isinstance(e, Exception):
                raise CheckpointError(f"saving {tag} in {self.dir} failed ({free} bytes were free there): {e}") from e
            raise
        self.saves.append(entry)

    def load_back(self) -> None:
        """Load the last checkpoint saved back into the engine, timed."""
        if self.saves:
            last = self.saves[-1]
            seconds = self._load(self.dir, last["tag"])[0]
            self.load = {"tag": last["tag"], "load_s": seconds, "bytes": last["bytes_total"]}

    def finish(self) -> None:
        """At the end, success or failure: remove DIR (and parents ds_bench made) if it holds no
        complete checkpoint."""
        with faults.deferred():
            remove_created(self.created)

    def record_keys(self) -> dict:
        """The run record's ``checkpoint`` (with --checkpoint) and ``resumed_from_step``/``resume``."""
        out = {}
        if self.dir:
            out["checkpoint"] = {"dir": os.path.abspath(self.dir), "every": self.every, "schedule": self.schedule,
                                 "api": api_of(self.io.engine) if self.io else None,
                                 **figures(self.saves, self.load)}
        if self.resume_dir:
            out.update(resumed_from_step=self.start, resume=self.resumed)
        return out

    def _resume(self) -> None:
        m = self.resume_marker
        seconds, client = self._load(self.resume_dir, m["tag"])
        problem = mismatch((client or {}).get(CLIENT_KEY) or {}, {**self.expected, "step": m["step"]})
        if problem:
            raise UserError(f"--resume {self.resume_dir}: {m['tag']} {problem}")
        self.resumed = {"dir": os.path.abspath(self.resume_dir), "tag": m["tag"], "load_s": seconds,
                        "bytes_total": m["bytes_total"], "load_GBps": gbps(m["bytes_total"], seconds)}

    def _load(self, folder: str, tag: str) -> tuple[float, dict]:
        seconds, (path, client) = self._timed(lambda: self.io.engine.load_checkpoint(folder, tag=tag))
        if path is None:
            raise CheckpointError(f"the engine could not load {tag} from {folder}")
        return seconds, client

    def _timed(self, op: Callable) -> tuple[float, object]:
        return timed(op, self.io.sync, self.io.barrier)


def resolve(cfg, world_size: int, micro_batch: int, grad_accum: int) -> Checkpointer:
    """Check --checkpoint, --checkpoint-every and --resume before the process group is joined (a
    ``UserError`` naming the flag) and say what the run will do."""
    expected = {"workload": cfg.workload, "seed": cfg.seed, "world_size": world_size, "micro_batch": micro_batch,
                "grad_accum": grad_accum}
    ck = Checkpointer(dir=cfg.checkpoint, every=cfg.checkpoint_every, resume_dir=cfg.resume, expected=expected)
    if cfg.resume is not None:
        ck.resume_marker = resumable(cfg.resume)
        problem = mismatch(ck.resume_marker, expected)
        if problem:
            raise UserError(f"--resume {cfg.resume}: {ck.resume_marker['tag']} {problem}")
        ck.start = ck.resume_marker["step"]
    if cfg.checkpoint is not None:
        ck.schedule = save_steps(ck.start, cfg.steps, cfg.checkpoint_every)
        if not ck.schedule:
            raise UserError(f"--checkpoint-every {cfg.checkpoint_every}: no step of this run ({ck.start + 1}.."
                            f"{ck.start + cfg.steps}) is a multiple of it, so nothing would be saved")
        ck.created = check_target(cfg.checkpoint, [tag_for(s) for s in ck.schedule])
    return ck


