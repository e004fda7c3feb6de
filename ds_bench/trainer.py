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
    """Per measured step, seconds; ``losses`` covers every step, warm-up included."""

    step_s: list[float] = field(default_factory=list)
    phase_s: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    losses: list[float] = field(default_factory=list)


def to_device(batch: Batch, device: torch.device, float_dtype: torch.dtype) -> Batch:
    """Move a batch, casting floating inputs to the engine's compute dtype (bf16/fp16 runs)."""
    return {k: v.to(device, dtype=float_dtype if v.is_floating_point() else None, non_blocking=True)
            for k, v in batch.items()}


def run_loop(engine, workload: Workload, batches: Iterator[Batch], *, steps: int, warmup: int,
             grad_accum: int, float_dtype: torch.dtype, sync: Callable[[], None],
             barrier: Callable[[], None]) -> LoopTimes:
    times = LoopTimes()
    losses = []
    for step in range(steps):
        if step == warmup:
            sync()
            barrier()
        phase = dict.fromkeys(PHASES, 0.0)
        start = time.perf_counter()
        for _ in range(grad_accum):
            losses.append(_micro_step(engine, workload, batches, float_dtype, sync, phase))
        if step >= warmup:
            times.step_s.append(time.perf_counter() - start)
            for name, seconds in phase.items():
                times.phase_s[name].append(seconds)
    per_step = torch.stack(losses).float().view(steps, grad_accum).mean(dim=1)
    times.losses = per_step.tolist()
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
