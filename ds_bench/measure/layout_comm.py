"""A parallel layout's own collectives timed as the run makes them: their time and count per step.

- AutoTP (``--tensor-parallel``): DeepSpeed's tensor-parallel layers (``deepspeed/module_inject/layers.py``: a
  row-parallel ``LinearAllreduce`` all-reduces its output in forward, a column-parallel ``LinearLayer`` its
  input's gradient in backward) call ``all_reduce``. Per micro-step on a Llama block: forward 2 (the attention
  output and MLP down projections), backward 5 (the q, k, v, gate and up projections' input gradients, each on
  its own: AutoTP does not fuse them as Megatron-LM's column-parallel QKV and gate/up do, Shoeybi et al. 2019
  sec. 3), each of micro-batch x sequence x hidden elements (``LlamaWorkload.tensor_parallel_all_reduces``).
- Ulysses (``--sequence-parallel``): DeepSpeed's Ulysses attention (``ulysses_sp.py``) exchanges q, k, v and
  the attention output through ``deepspeed.sequence.layer._dim_zero_all_to_all``, a registered operator whose
  forward and backward both call ``all_to_all_single``. Per micro-step and layer 4 in forward and 4 in
  backward, 4 more with activation checkpointing (``CausalLMWorkload.sequence_parallel_all_to_alls``;
  measured on 2 CPU ranks, tiny Llama, 2 layers: 16 per micro-step).
- Experts (``--expert-parallel``, ``--workload moe``): DeepSpeed's MoE layer (``deepspeed/moe/sharded_moe.py``) sends
  tokens to their experts and back through ``_AllToAll``, whose forward and backward call ``all_to_all_single``:
  per MoE block 2 in forward and 2 in backward, 2 more with activation checkpointing, none at EP = 1
  (``tests/test_moe.py`` checks the count; the load balance beside them: ``ds_bench.measure.expert_load``).

How they are taken: the layers reach the collective through their module's ``dist`` (``deepspeed.comm``).
``CommTimer`` gives that module, for the run, a stand-in for ``dist`` that passes every call through and puts
each call of the timed collective between two ``DeviceClock`` marks. A mark never blocks: on CPU ranks it is
the host clock and the call's host time is its time (gloo's collectives on CPU tensors return once done, the
wait for the slower peer included); on a GPU it is a CUDA event on the stream, read after the loop's one
synchronize at the end of the step (``ds_bench.measure.loop``), so the timing adds no synchronize. An
``async_op`` call is counted but not timed: its time overlaps compute.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import numpy as np

from ds_bench.config.degrees import DEGREES


@dataclass(frozen=True)
class Timed:
    """Which collective of which DeepSpeed module a layout's timer takes, and the record's names for it."""

    module: str
    op: str
    timer: str
    """The timer's name in ``LoopTimes.stage_s``."""
    what: str
    """The collective, as the record's ``comm`` block names it."""

    @property
    def calls(self) -> str:
        return f"{self.timer}_calls"


TIMED = {
    "tensor_parallel": Timed("deepspeed.module_inject.layers", "all_reduce", DEGREES["tensor_parallel"].comm,
                             "all_reduce"),
    "sequence_parallel": Timed("deepspeed.sequence.layer", "all_to_all_single", DEGREES["sequence_parallel"].comm,
                               "all_to_all"),
    "expert_parallel": Timed("deepspeed.moe.sharded_moe", "all_to_all_single", DEGREES["expert_parallel"].comm,
                             "all_to_all"),
}
"""By ``Layout`` degree field: the collectives each layout makes of its own (module docstring)."""


def timer(degree: str, clock) -> CommTimer:
    """This rank's timer of ``degree``'s collective (``TIMED``)."""
    t = TIMED[degree]
    return CommTimer(clock, importlib.import_module(t.module), t.op, t.timer, t.calls)


def _payload_bytes(op: str, args: tuple, kwargs: dict) -> int:
    """Bytes of the tensor a rank gives the collective: ``all_to_all_single(output, input)``'s input, an
    ``all_reduce``'s tensor."""
    tensor = kwargs.get("input", args[1] if len(args) > 1 else None) if op == "all_to_all_single" else kwargs.get(
        "tensor", args[0] if args else None)
    return tensor.numel() * tensor.element_size() if hasattr(tensor, "element_size") else 0


def per_step(degree: str, times_s: dict[str, list[float]], step_s: list[float]) -> dict | None:
    """A degree's ``comm`` block (``ds_bench.record.run_blocks.DegreeComm``, one shape for every degree) from one
    rank's timers: the ``collective``, ``ms_per_step``, ``calls_per_step``, ``share_of_step`` and ``bytes_per_step``,
    medians over the measured steps; None where the degree's collective was not timed."""
    t = TIMED.get(degree)
    if t is None or t.timer not in times_s or not step_s:
        return None
    comm, steps = np.asarray(times_s[t.timer], dtype=float), np.asarray(step_s, dtype=float)
    sent = times_s.get(f"{t.timer}_bytes")
    return {"collective": t.what, "ms_per_step": float(np.median(comm)) * 1e3,
            "calls_per_step": int(np.median(times_s[t.calls])), "share_of_step": float(np.median(comm / steps)),
            "bytes_per_step": float(np.median(sent)) if sent else None}


class CommTimer:
    """This rank's timer of ``op`` in ``module.dist``: ``begin`` before a step, ``read`` once it is synchronized."""

    def __init__(self, clock, module, op: str, timer: str, calls: str):
        self.clock, self.op, self.timer, self.calls = clock, op, timer, calls
        self.marks, self.untimed, self.sent = [], 0, 0
        if isinstance(module.dist, _TimedComm):  # a later engine in this process: its timer takes over
            module.dist._timers = self
        else:
            module.dist = _TimedComm(module.dist, self)

    def begin(self) -> None:
        self.marks, self.untimed, self.sent = [], 0, 0

    def read(self) -> dict[str, float]:
        """Seconds in the collective since ``begin``, how many calls there were and the bytes this rank gave them."""
        return {self.timer: sum(self.clock.seconds(start, end) for start, end in self.marks),
                self.calls: float(len(self.marks) + self.untimed), f"{self.timer}_bytes": float(self.sent)}


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
            timers.sent += _payload_bytes(timers.op, args, kwargs)
            if kwargs.get("async_op"):
                timers.untimed += 1
                return call(*args, **kwargs)
            start = timers.clock.mark()
            try:
                return call(*args, **kwargs)
            finally:
                timers.marks.append((start, timers.clock.mark()))
        return timed

