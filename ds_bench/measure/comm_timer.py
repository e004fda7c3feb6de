"""A collective timed as the run makes it: one ``deepspeed.comm`` call of a parallel layout's layers, its time
and count per step (AutoTP's all-reduces: ``ds_bench.measure.tp_comm``; Ulysses' all-to-alls:
``ds_bench.measure.sp_comm``).

How it is taken: the layers reach the collective through their module's ``dist`` (``deepspeed.comm``).
``CommTimer`` gives that module, for the run, a stand-in for ``dist`` that passes every call through and puts
each call of the timed collective between two ``DeviceClock`` marks. A mark never blocks: on CPU ranks it is
the host clock and the call's host time is its time (gloo's collectives on CPU tensors return once done, the
wait for the slower peer included); on a GPU it is a CUDA event on the stream, read after the loop's one
synchronize at the end of the step (``ds_bench.measure.loop``), so the timing adds no synchronize. An
``async_op`` call is counted but not timed: its time overlaps compute.
"""

from __future__ import annotations

import numpy as np


class CommTimer:
    """This rank's timer of ``op`` in ``module.dist``: ``begin`` before a step, ``read`` once it is synchronized."""

    def __init__(self, clock, module, op: str, timer: str, calls: str):
        self.clock, self.op, self.timer, self.calls = clock, op, timer, calls
        self.marks, self.untimed = [], 0
        if isinstance(module.dist, _TimedComm):  # a later engine in this process: its timer takes over
            module.dist._timers = self
        else:
            module.dist = _TimedComm(module.dist, self)

    def begin(self) -> None:
        self.marks, self.untimed = [], 0

    def read(self) -> dict[str, float]:
        """Seconds in the collective since ``begin``, and how many calls there were."""
        return {self.timer: sum(self.clock.seconds(start, end) for start, end in self.marks),
                self.calls: float(len(self.marks) + self.untimed)}


class _TimedComm:
    """``deepspeed.comm`` with its timer's collective timed (module docstring); anything else passes through."""

    def __init__(self, comm, timers: CommTimer):
        self._comm, self._timers = comm, timers

    def __getattr__(self, name):
        if name != self._timers.op:
            return getattr(self._comm, name)
        return self._timed(getattr(self._comm, name))

    def _timed(self, call):
        timers = self._timers

        def timed(*args, **kwargs):
            if kwargs.get("async_op"):
                timers.untimed += 1
                return call(*args, **kwargs)
            start = timers.clock.mark()
            try:
                return call(*args, **kwargs)
            finally:
                timers.marks.append((start, timers.clock.mark()))
        return timed


def per_step(times_s: dict[str, list[float]], step_s: list[float], timer: str, calls: str, what: str) -> dict | None:
    """``{what}_ms``, ``calls_per_step`` and ``share_of_step`` from one rank's timer: medians over the measured
    steps."""
    if timer not in times_s or not step_s:
        return None
    comm, steps = np.asarray(times_s[timer], dtype=float), np.asarray(step_s, dtype=float)
    return {f"{what}_ms": float(np.median(comm)) * 1e3, "calls_per_step": int(np.median(times_s[calls])),
            "share_of_step": float(np.median(comm / steps))}
