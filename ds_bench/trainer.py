"""The timed training loop: warm-up, then measured steps with a per-phase breakdown.

A step is one global batch: ``gradient_accumulation_steps`` micro-steps of forward, backward
and ``engine.step()``. Clocks are read only after ``accelerator.synchronize()`` (a no-op on CPU),
so GPU time is attributed to the phase that queued it, and a barrier opens the measured window so
every rank's clock starts together. Warm-up steps run the same code but are not kept.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ds_bench.workloads.base import Batch, Workload

PHASES = ("data", "forward", "backward", "optimizer")


@dataclass
class LoopTimes:
    """Filled step by step, so a run that ends early still has what it measured.

    ``step_s`` and ``phase_s`` hold measured steps (warm-up excluded), in seconds; ``step_losses``
    holds every finished step's mean loss (a device scalar), warm-up included.
    """

    step_s: list[float] = field(default_factory=list)
    phase_s: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    step_losses: list[torch.Tensor] = field(default_factory=list)

    @property
    def steps_done(self) -> int:
        return len(self.step_losses)

    def losses(self) -> list[float]:
        return torch.stack(self.step_losses).float().tolist() if self.step_losses else []


def to_device(batch: Batch, device: torch.device, float_dtype: torch.dtype) -> Batch:
    """Move a batch, casting floating inputs to the engine's compute dtype (bf16/fp16 runs)."""
    return {k: v.to(device, dtype=float_dtype if v.is_floating_point() else None, non_blocking=True)
            for k, v in batch.items()}


def run_loop(engine, workload: Workload, batches: Iterator[Batch], *, steps: int, warmup: int,
             grad_accum: int, float_dtype: torch.dtype, sync: Callable[[], None],
             barrier: Callable[[], None], times: LoopTimes, beat: Callable[[int], None] = lambda done: None,
             on_window_open: Callable[[], None] = lambda: None) -> LoopTimes:
    """Run ``steps`` steps into ``times``; ``beat(steps_done)`` after each (the step watchdog)."""
    for step in range(steps):
        if step == warmup:
            sync()
            barrier()
            on_window_open()
        phase = dict.fromkeys(PHASES, 0.0)
        start = time.perf_counter()
        losses = [_micro_step(engine, workload, batches, float_dtype, sync, phase) for _ in range(grad_accum)]
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.step_s.append(elapsed)
            for name, seconds in phase.items():
                times.phase_s[name].append(seconds)
        times.step_losses.append(torch.stack(losses).float().mean())
        beat(times.steps_done)
    return times


def _micro_step(engine, workload, batches, float_dtype, sync, phase) -> torch.Tensor:
    t0 = time.perf_counter()
    batch = to_device(next(batches), engine.device, float_dtype)
    sync()
    t1 = time.perf_counter()
    loss = workload.loss(engine, batch)
    sync()
    t2 = time.perf_counter()
    engine.backward(loss)
    sync()
    t3 = time.perf_counter()
    engine.step()
    sync()
    t4 = time.perf_counter()
    for name, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
        phase[name] += seconds
    return loss.detach()
