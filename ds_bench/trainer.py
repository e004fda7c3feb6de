"""The timed training loop: warm-up, then measured steps with a per-phase breakdown.

A step is one global batch: ``gradient_accumulation_steps`` micro-steps of forward, backward
and ``engine.step()``. Clocks are read only after ``accelerator.synchronize()`` (a no-op on CPU),
so GPU time is attributed to the phase that queued it, and a barrier opens the measured window so
every rank's clock starts together. Warm-up steps run the same code but are not kept.

Compute time (``LoopTimes.compute_s``, what slow-rank detection compares) is forward plus the
autograd backward of each micro-step: from the start of forward to the moment autograd finishes
its graph, marked by a callback queued on the autograd engine. It excludes the gradient reduction
DeepSpeed runs after autograd (``engine.backward``'s epilogue), which is where a fast rank waits
for a slow one, so a slow rank's compute time is longer than its peers' even though their step
times are equal. The backward phase of the breakdown cannot serve: it contains that wait. The mark
costs no synchronisation: on CPU it is a wall-clock read; on CUDA it is an event recorded on the
stream, read after the synchronize the loop already does after backward (``DeviceClock``).
Limits: reductions DeepSpeed starts inside autograd (ZeRO-2 with ``overlap_comm`` or a full
reduce bucket) and ZeRO-3's parameter all-gathers in forward are waits counted as compute.
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
    compute_s: list[float] = field(default_factory=list)
    """Forward + autograd backward per measured step (module docstring), seconds."""

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
             on_window_open: Callable[[], None] = lambda: None, clock: DeviceClock | None = None) -> LoopTimes:
    """Run ``steps`` steps into ``times``; ``beat(steps_done)`` after each (the step watchdog)."""
    clock = clock or DeviceClock(torch.device("cpu"))
    for step in range(steps):
        if step == warmup:
            sync()
            barrier()
            on_window_open()
        phase = dict.fromkeys(PHASES, 0.0)
        phase["compute"] = 0.0
        start = time.perf_counter()
        losses = [_micro_step(engine, workload, batches, float_dtype, sync, phase, clock) for _ in range(grad_accum)]
        elapsed = time.perf_counter() - start
        if step >= warmup:
            times.step_s.append(elapsed)
            for name in PHASES:
                times.phase_s[name].append(phase[name])
            times.compute_s.append(phase["compute"])
        times.step_losses.append(torch.stack(losses).float().mean())
        beat(times.steps_done)
    return times


def _micro_step(engine, workload, batches, float_dtype, sync, phase, clock) -> torch.Tensor:
    t0 = time.perf_counter()
    batch = to_device(next(batches), engine.device, float_dtype)
    sync()
    t1 = time.perf_counter()
    compute_start = clock.mark()
    loss = workload.loss(engine, batch)
    autograd_end = clock.mark_autograd_end(loss)
    sync()
    t2 = time.perf_counter()
    engine.backward(loss)
    sync()
    t3 = time.perf_counter()
    phase["compute"] += clock.seconds(compute_start, autograd_end)
    engine.step()
    sync()
    t4 = time.perf_counter()
    for name, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
        phase[name] += seconds
    return loss.detach()


class DeviceClock:
    """Time stamps that need no synchronisation: wall clock on CPU, timing events on CUDA.

    ``seconds`` may only be called once the device has finished the marked work (on CUDA: after a
    synchronize, which the loop does after backward anyway).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return [time.perf_counter()]
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return [event]

    def mark_autograd_end(self, loss: torch.Tensor) -> list:
        """A stamp filled in when autograd finishes the backward of ``loss`` (before DeepSpeed's
        gradient-reduction epilogue); left empty if that backward never ran."""
        box: list = []
        if loss.requires_grad:
            queue = torch.autograd.Variable._execution_engine.queue_callback  # run once the graph is done
            loss.register_hook(lambda grad: queue(lambda: box.extend(self.mark())))
        return box

    def seconds(self, start: list, end: list) -> float:
        if not end:
            return 0.0
        if self.cuda:
            return start[0].elapsed_time(end[0]) / 1e3
        return end[0] - start[0]
