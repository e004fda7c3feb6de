"""AutoTP's all-reduces timed as the run makes them: the tensor-parallel communication time per step.

DeepSpeed's tensor-parallel layers (``deepspeed/module_inject/layers.py``: a row-parallel ``LinearAllreduce``
all-reduces its output in forward, a column-parallel ``LinearLayer`` its input's gradient in backward) reach
``all_reduce`` through that module's ``dist``, which ``ds_bench.measure.comm_timer`` times (how, and why it
adds no synchronize, is said there).

Count per micro-step on a Llama block: forward 2 (the attention output and MLP down projections), backward
5 (the q, k, v, gate and up projections' input gradients, each all-reduced on its own: AutoTP does not fuse
them as Megatron-LM's column-parallel QKV and gate/up do, Shoeybi et al. 2019 sec. 3), each of micro-batch
x sequence x hidden elements.
"""

from __future__ import annotations

from ds_bench.measure.comm_timer import CommTimer
from ds_bench.measure.comm_timer import per_step as _per_step

TIMER = "tp_all_reduce"
CALLS = "tp_all_reduce_calls"


def timer(clock) -> CommTimer:
    """This rank's AutoTP all-reduce timer."""
    from deepspeed.module_inject import layers

    return CommTimer(clock, layers, "all_reduce", TIMER, CALLS)


def per_step(times_s: dict[str, list[float]], step_s: list[float]) -> dict | None:
    """The record's ``tensor_parallel_comm`` from one rank's timers: medians over the measured steps."""
    return _per_step(times_s, step_s, TIMER, CALLS, "all_reduce")
