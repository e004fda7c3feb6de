"""Per-stage timers of a pipeline run: each pipeline instruction timed as DeepSpeed's engine executes it.

How they are taken: ``PipelineEngine._exec_schedule`` runs a step as a list of instructions (``LoadMicroBatch``,
``ForwardPass``, ``SendActivation``, ``RecvGrad``, ... ``OptimizerStep``: ``deepspeed.runtime.pipe.schedule``),
looking each one's handler up in ``self._INSTRUCTION_MAP``. ``StageTimers`` gives the engine instance its
own copy of that map (the class's is left alone), each handler wrapped between two ``DeviceClock`` marks.
A mark never blocks: on CPU ranks it is the host clock, and the instruction's host time is its time, since
CPU ops and gloo's send, recv and all-reduce are synchronous (they return once done); on a GPU it is a
CUDA event recorded on the stream, and the events are read after the loop's one synchronize at the end of
the step (``ds_bench.measure.loop``), so the timers add no synchronize and never serialize what the
schedule overlaps. The default timing stays one synchronize per step.

Timers (each summed over the step's micro-batches, then the median over the measured steps, in ms; names
after Megatron-LM's): ``batch_load`` (``LoadMicroBatch``: first and last stage), ``forward_compute``
(``ForwardPass``: on the last stage the LM head and the loss too), ``backward_compute`` (``BackwardPass``,
activation recomputation included), ``forward_recv``/``forward_send`` (activations), ``backward_recv``/
``backward_send`` (gradients), ``tied_grads_all_reduce`` (``ReduceTiedGrads``: the tied embedding/head
gradient summed across the stages that hold it), ``grads_all_reduce`` (``ReduceGrads``: data-parallel),
``optimizer`` (``OptimizerStep``), ``other`` (the step less every instruction: buffer set-up, the loss
broadcast from the last stage, the loop's own synchronize) and ``step`` (the stage's own step time).
A send or receive's time is mostly waiting for the peer stage (gloo's send returns once the receiver
has the data), the reductions also hold the wait for the slowest participant.

The measured bubble of a stage is the share of its step spent in no forward or backward compute,
1 - (forward + backward) / step, per step, then the median. It is what the stage could not spend on the
model, whatever the cause: waits on the other stages (the fill and drain that the schedule's
(P - 1) / (m + P - 1) counts, and any imbalance between stages, which it does not), but also the
optimizer, the reductions and batch loading, which the schedule's formula leaves out; those are in the
timers beside it, so the reader can tell them apart.
"""

from __future__ import annotations

import numpy as np

INSTRUCTIONS = {
    "LoadMicroBatch": "batch_load",
    "ForwardPass": "forward_compute",
    "RecvActivation": "forward_recv",
    "SendActivation": "forward_send",
    "BackwardPass": "backward_compute",
    "RecvGrad": "backward_recv",
    "SendGrad": "backward_send",
    "ReduceTiedGrads": "tied_grads_all_reduce",
    "ReduceGrads": "grads_all_reduce",
    "OptimizerStep": "optimizer",
}
"""Schedule instruction class name -> timer."""
TIMERS = tuple(INSTRUCTIONS.values())
COMPUTE = ("forward_compute", "backward_compute")


class StageTimers:
    """This rank's instruction timers: ``begin`` before a step, ``read`` once the step is synchronized."""

    def __init__(self, engine, clock):
        self.clock, self.stage, self.marks = clock, engine.stage_id, []
        engine._INSTRUCTION_MAP = {kind: self._timed(INSTRUCTIONS.get(kind.__name__, kind.__name__), handler)
                                   for kind, handler in engine._INSTRUCTION_MAP.items()}

    def _timed(self, name: str, handler):
        def timed(engine, **kwargs):
            start = self.clock.mark()
            try:
                return handler(engine, **kwargs)
            finally:
                self.marks.append((name, start, self.clock.mark()))
        timed.__name__ = getattr(handler, "__name__", name)
        return timed

    def begin(self) -> None:
        self.marks = []

    def read(self) -> dict[str, float]:
        """Seconds per timer in the step since ``begin`` (instructions of one kind summed)."""
        out = dict.fromkeys(TIMERS, 0.0)
        for name, start, end in self.marks:
            out[name] = out.get(name, 0.0) + self.clock.seconds(start, end)
        return out


def stage_times(step_s: list[float], timer_s: dict[str, list[float]]) -> tuple[dict[str, float], float]:
    """One rank's (timers in ms, measured bubble): each timer's median over the steps, ``other`` (the step
    less its instructions) and ``step``; the bubble as the module docstring defines it."""
    steps = np.asarray(step_s, dtype=float)
    per_step = {name: np.asarray(values, dtype=float) for name, values in timer_s.items()}
    times = {name: float(np.median(values)) * 1e3 for name, values in per_step.items()}
    times["other"] = float(np.median(steps - sum(per_step.values()))) * 1e3
    times["step"] = float(np.median(steps)) * 1e3
    compute = sum(per_step.get(name, np.zeros_like(steps)) for name in COMPUTE)
    return times, float(np.median(1 - compute / steps))


def per_stage(reports: list, layout: list[dict]) -> list[dict]:
    """The record's ``pipeline_layout``: each stage's layout with its first data-parallel rank's timers and
    bubble, and its peak memory (the largest of the stage's ranks' peaks). ``reports``: every rank's
    ``ds_bench.measure.metrics.RankReport``."""
    out = []
    for entry in layout:
        ranks = sorted((r for r in reports if r.pipeline_stage == entry["stage"]), key=lambda r: r.rank)
        if not ranks or not ranks[0].stage_s:
            out.append(entry)
            continue
        kind = "allocated" if "allocated" in ranks[0].peak_mem else "rss"
        times, bubble = stage_times(ranks[0].step_s, ranks[0].stage_s)
        out.append({**entry, "rank": ranks[0].rank, "times_ms": times, "bubble": bubble,
                    "peak_mem_bytes": max(r.peak_mem.get(kind, 0) for r in ranks)})
    return out
