"""AutoTP's all-reduces timed as the run makes them: the tensor-parallel communication time per step.

How they are taken: DeepSpeed's tensor-parallel layers (``deepspeed/module_inject/layers.py``: a row-parallel
``LinearAllreduce`` all-reduces its output in forward, a column-parallel ``LinearLayer`` its input's gradient
in backward) reach ``all_reduce`` through that module's ``dist`` (``deepspeed.comm``). ``TensorParallelTimers``
gives the module, for the run, a stand-in for ``dist`` that passes every call through and puts each
``all_reduce`` between two ``DeviceClock`` marks. A mark never blocks: on CPU ranks it is the host clock and
the call's host time is its time (gloo's all-reduce of CPU tensors returns once done, the wait for the slower
peer included); on a GPU it is a CUDA event on the stream, read after the loop's one synchronize at the end
of the step (``ds_bench.measure.loop``), so the timing adds no synchronize. An ``async_op`` all-reduce
(DeepSpeed's overlapped column-parallel backward) is counted but not timed: its time overlaps compute.

Count per micro-step on a Llama block: forward 2 (the attention output and MLP down projections), backward
5 (the q, k, v, gate and up projections' input gradients, each all-reduced on its own: AutoTP does not fuse
them as Megatron-LM's column-parallel QKV and gate/up do, Shoeybi et al. 2019 sec. 3), each of micro-batch
x sequence x hidden elements.
"""

from __future__ import annotations

import numpy as np

TIMER = "tp_all_reduce"
CALLS = "tp_all_reduce_calls"


class TensorParallelTimers:
    """This rank's AutoTP all-reduce timer: ``begin`` before a step, ``read`` once the step is synchronized."""

    def __init__(self, clock):
        from deepspeed.module_inject import layers

        self.clock, self.marks, self.untimed = clock, [], 0
        if isinstance(layers.dist, _TimedComm):  # a later engine in this process: its timer takes over
            layers.dist._timers = self
        else:
            layers.dist = _TimedComm(layers.dist, self)

    def begin(self) -> None:
        self.marks, self.untimed = [], 0

    def read(self) -> dict[str, float]:
        """Seconds in AutoTP's all-reduces since ``begin``, and how many there were."""
        return {TIMER: sum(self.clock.seconds(start, end) for start, end in self.marks),
                CALLS: float(len(self.marks) + self.untimed)}


class _TimedComm:
    """``deepspeed.comm`` with ``all_reduce`` timed (module docstring); anything else passes through."""

    def __init__(self, comm, timers: TensorParallelTimers):
        self._comm, self._timers = comm, timers

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def all_reduce(self, *args, **kwargs):
        timers = self._timers
        if kwargs.get("async_op"):
            timers.untimed += 1
            return self._comm.all_reduce(*args, **kwargs)
        start = timers.clock.mark()
        try:
            return self._comm.all_reduce(*args, **kwargs)
        finally:
            timers.marks.append((start, timers.clock.mark()))


def per_step(times_s: dict[str, list[float]], step_s: list[float]) -> dict | None:
    """The record's ``tensor_parallel_comm`` from one rank's timers: medians over the measured steps."""
    if TIMER not in times_s or not step_s:
        return None
    comm, steps = np.asarray(times_s[TIMER], dtype=float), np.asarray(step_s, dtype=float)
    return {"all_reduce_ms": float(np.median(comm)) * 1e3, "calls_per_step": int(np.median(times_s[CALLS])),
            "share_of_step": float(np.median(comm / steps))}
