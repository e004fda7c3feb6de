"""The timed training loop: warm-up, then measured steps with a per-phase breakdown.

A step is one global batch: ``gradient_accumulation_steps`` micro-steps of forward, backward
and ``engine.step()``. A barrier opens the measured window so every rank's clock starts together;
warm-up steps run the same code but are not kept. Two timing modes (``timing``):

- ``step`` (default): one ``accelerator.synchronize()`` per step, at its end, before the clock is
  read; nothing inside the step waits for the device, so what DeepSpeed overlaps (gradient buckets,
  ZeRO-3 prefetch, optimizer launches) stays overlapped. Phases are stamped with ``DeviceClock``
  marks that do not block the host (CUDA events on the stream; wall clock on CPU, where every op
  has finished when it returns) and read after that one synchronize.
- ``breakdown`` (``--breakdown``): a synchronize after each phase of each micro-step (4 per
  micro-step), so each phase's host+device time is its own; it serializes overlapped work, so the
  step it measures can be slower than the real one (Megatron-LM says the same of its synced timers).

Outside clock: the window closes with a synchronize and a barrier; ``LoopTimes.window_s`` is the
wall time from the opening barrier to the closing one, less the time spent in ``after_step`` (the
caller's work between steps, such as checkpoint saves: ``LoopTimes.excluded_s``), which the sum of
step times must match.

Compute time (``LoopTimes.compute_s``, what slow-rank detection compares) is forward plus the
autograd backward of each micro-step: from the start of forward to the moment autograd finishes
its graph, marked by a callback queued on the autograd engine. It excludes the gradient reduction
DeepSpeed runs after autograd (``engine.backward``'s epilogue), which is where a fast rank waits
for a slow one, so a slow rank's compute time is longer than its peers' even though their step
times are equal. The backward phase of the breakdown cannot serve: it contains that wait. The mark
costs no synchronisation: on CPU it is a wall-clock read; on CUDA it is an event recorded on the
stream, read after the step's synchronize (``DeviceClock``).
Limits: reductions DeepSpeed starts inside autograd (ZeRO-2 with ``overlap_comm`` or a full
reduce bucket) and ZeRO-3's parameter all-gathers in forward are waits counted as compute.

Pipeline engines (``pipeline=True``, ``--pipeline-stages``): DeepSpeed's ``PipelineEngine.train_batch``
runs a whole step (all micro-batches through all stages, the sends and receives, the tied and
data-parallel gradient reductions, the optimizer), so a step is one ``train_batch`` call: same warm-up,
same opening barrier, one synchronize at its end before the clock is read. Its one phase is
``train_batch``; no compute time is split out (waits on other stages are inside the call), so slow-rank
detection has nothing to compare. Inside the step, ``stage_timers`` (``ds_bench.measure.stage_timers``) time
each pipeline instruction with the same non-blocking marks, read after the step's one synchronize, into
``LoopTimes.stage_s``. The step's loss is what ``train_batch`` returns: the mean over the
micro-batches, averaged over data-parallel replicas, the same on every stage.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from ds_bench.measure.stage_timers import StageTimers
from ds_bench.measure.layout_comm import CommTimer
from ds_bench.workloads.base import Batch, Workload

PHASES = ("data", "forward", "backward", "optimizer")
PIPELINE_PHASES = ("train_batch",)


@dataclass
class LoopTimes:
    """Filled step by step, so a run that ends early still has what it measured.

    ``step_s`` and ``phase_s`` hold measured steps (warm-up excluded), in seconds; ``step_losses``
    holds every finished step's mean loss (a device scalar), warm-up included, and ``step_grad_norms`` the
    global gradient norm the engine computed at that step's optimizer step (``grad_norm``), read without a
    synchronization of its own.
    """

    step_s: list[float] = field(default_factory=list)
    phase_s: dict[str, list[float]] = field(default_factory=lambda: {p: [] for p in PHASES})
    step_losses: list[torch.Tensor] = field(default_factory=list)
    step_grad_norms: list = field(default_factory=list)
    """Per finished step: a device scalar, a float or None (the engine computed no norm that step)."""
    compute_s: list[float] = field(default_factory=list)
    """Forward + autograd backward per measured step (module docstring), seconds."""
    window_s: float = 0.0
    """Wall time of the measured window, opening barrier to closing barrier (the outside clock),
    less ``excluded_s``."""
    excluded_s: float = 0.0
    """Wall time spent in ``after_step`` within the measured window: in no step and not in ``window_s``."""
    stage_s: dict[str, list[float]] = field(default_factory=dict)
    """Pipeline runs: seconds per measured step of each instruction timer (``ds_bench.measure.stage_timers``);
    tensor- and sequence-parallel runs: AutoTP's all-reduce or Ulysses' all-to-all seconds and count per measured
    step (``ds_bench.measure.layout_comm``)."""
    pipeline_stage: int | None = None
    """Pipeline runs: this rank's stage."""

    @property
    def steps_done(self) -> int:
        return len(self.step_losses)

    def losses(self) -> list[float]:
        return torch.stack(self.step_losses).float().tolist() if self.step_losses else []

    def grad_norms(self) -> list[float | None]:
        return [None if g is None else float(g) for g in self.step_grad_norms]


def to_device(batch: Batch, device: torch.device, float_dtype: torch.dtype) -> Batch:
    """Move a batch's tensors, casting floating inputs to the engine's compute dtype (bf16/fp16 runs); anything
    else (a sharded batch's token counts) stays as it is."""
    return {k: v.to(device, dtype=float_dtype if v.is_floating_point() else None, non_blocking=True)
            if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def run_loop(engine, workload: Workload, batches: Iterator[Batch], *, steps: int, warmup: int,
             grad_accum: int, float_dtype: torch.dtype, sync: Callable[[], None],
             barrier: Callable[[], None], times: LoopTimes, beat: Callable[[int], None] = lambda done: None,
             on_window_open: Callable[[], None] = lambda: None, clock: DeviceClock | None = None,
             breakdown: bool = False, after_step: Callable[[int], None] = lambda done: None,
             pipeline: bool = False, stage_timers: StageTimers | CommTimer | None = None,
             micro_step_context: Callable[[], contextlib.AbstractContextManager] | None = None) -> LoopTimes:
    """Run ``steps`` steps into ``times``; ``beat(steps_done)`` after each (the step watchdog), then
    ``after_step(steps_done)``, whose time is in no step and is taken out of the window. ``pipeline``:
    each step is one ``engine.train_batch`` over ``batches`` of ``(inputs, labels)``, its instructions timed
    by ``stage_timers`` if given; otherwise ``stage_timers`` may be a collective's timer (AutoTP's all-reduces,
    Ulysses' all-to-alls: ``ds_bench.measure.layout_comm``), begun and read around each step the same way.
    ``micro_step_context``: a context entered around each micro-step's forward and backward (ALST's checkpoint
    offload, ``ds_bench.engines.tiling``)."""
    clock = clock or DeviceClock(torch.device("cpu"))
    phase_sync = sync if breakdown else None
    phases = PIPELINE_PHASES if pipeline else PHASES
    if pipeline:
        times.phase_s = {name: [] for name in phases}
        times.pipeline_stage = stage_timers.stage if stage_timers else None
    window_start = None
    for step in range(steps):
        if step == warmup:
            sync()
            barrier()
            window_start = time.perf_counter()
            on_window_open()
        start = time.perf_counter()
        if pipeline:
            stamps = [_pipeline_step(engine, batches, clock, stage_timers)]
        else:
            if stage_timers is not None:
                stage_timers.begin()
            stamps = [_micro_step(engine, workload, batches, float_dtype, phase_sync, clock, micro_step_context)
                      for _ in range(grad_accum)]
        if not breakdown:  # breakdown mode has just synchronized after the optimizer phase
            sync()
        elapsed = time.perf_counter() - start
        if step >= warmup:
            _keep(times, elapsed, stamps, clock, phases, stage_timers)
        times.step_losses.append(torch.stack([m.loss for m in stamps]).float().mean())
        times.step_grad_norms.append(grad_norm(engine))
        beat(times.steps_done)
        outside = time.perf_counter()
        after_step(times.steps_done)
        if window_start is not None:
            times.excluded_s += time.perf_counter() - outside
    if window_start is not None:
        barrier()
        times.window_s = time.perf_counter() - window_start - times.excluded_s
    return times


def _keep(times: LoopTimes, elapsed: float, stamps: list, clock: DeviceClock, phases: tuple,
          stage_timers: StageTimers | CommTimer | None) -> None:
    """A measured step's time, phases, compute time (not under a pipeline) or stage timers (read once the
    step is synchronized)."""
    times.step_s.append(elapsed)
    for i, name in enumerate(phases):
        times.phase_s[name].append(sum(clock.seconds(m.bounds[i], m.bounds[i + 1]) for m in stamps))
    if stage_timers is not None:
        for name, seconds in stage_timers.read().items():
            times.stage_s.setdefault(name, []).append(seconds)
    if phases is PHASES:
        times.compute_s.append(sum(clock.seconds(m.bounds[1], m.autograd_end) for m in stamps))


def grad_norm(engine):
    """The global gradient norm (before clipping) the engine computed at its last optimizer step, as it holds it
    (a device scalar is not read here: no synchronization); None where it computed none. DeepSpeed's engines
    keep it (``DeepSpeedEngine.get_global_grad_norm``: ZeRO 1-3 always, ZeRO-0 and the pipeline engine when
    ``gradient_clipping`` is on); ds_bench's DDP/FSDP engine when it clips (``clip_grad_norm_``'s total norm).
    The norm DeepSpeed #7718 got wrong (ZeRO-2 with accumulation, deepspeed 0.17.6-0.18.2)."""
    read = getattr(engine, "get_global_grad_norm", None)
    value = read() if read is not None else None
    return value.detach().float() if isinstance(value, torch.Tensor) else value


@dataclass(frozen=True)
class MicroStep:
    bounds: list
    """Clock marks at the start and after each of ``PHASES``: phase i runs from bounds[i] to bounds[i+1]."""
    autograd_end: list
    loss: torch.Tensor


def _micro_step(engine, workload, batches, float_dtype, phase_sync, clock, context=None) -> MicroStep:
    """One micro-step and its clock marks (read once the device has finished). ``phase_sync`` (the
    ``breakdown`` mode) waits for the device after each phase; ``context()`` is entered around forward and
    backward."""
    bounds = [clock.mark()]
    batch = to_device(next(batches), engine.device, float_dtype)
    bounds.append(_mark(clock, phase_sync))
    with context() if context else contextlib.nullcontext():
        loss = workload.loss(engine, batch)
        autograd_end = clock.mark_autograd_end(loss)
        bounds.append(_mark(clock, phase_sync))
        engine.backward(loss)
    bounds.append(_mark(clock, phase_sync))
    engine.step()
    bounds.append(_mark(clock, phase_sync))
    return MicroStep(bounds, autograd_end, loss.detach())


def _pipeline_step(engine, batches, clock, stage_timers) -> MicroStep:
    """One pipeline step: ``train_batch`` pulls its micro-batches from ``batches`` on the first and last stage."""
    if stage_timers is not None:
        stage_timers.begin()
    start = clock.mark()
    loss = engine.train_batch(data_iter=batches)
    return MicroStep([start, clock.mark()], [], loss.detach())


def timing(breakdown: bool, grad_accum: int, pipeline: bool = False) -> dict:
    """The record's description of the timing mode ``run_loop`` used."""
    if pipeline:
        return {"timing_mode": "pipeline_step", "syncs_per_step": 1}
    if breakdown:
        return {"timing_mode": "breakdown", "syncs_per_step": len(PHASES) * grad_accum}
    return {"timing_mode": "step", "syncs_per_step": 1}


def _mark(clock: DeviceClock, phase_sync: Callable[[], None] | None) -> list:
    if phase_sync is not None:
        phase_sync()
    return clock.mark()


class DeviceClock:
    """Time stamps that need no synchronisation: wall clock on CPU, timing events on CUDA.

    ``seconds`` may only be called once the device has finished the marked work (on CUDA: after a
    synchronize, which the loop does at the end of every step).
    """

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        """A stamp of now on the device's timeline (on CPU, the host's: CPU ops finish as they return)."""
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
