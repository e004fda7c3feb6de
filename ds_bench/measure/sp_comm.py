"""Ulysses' all-to-alls timed as the run makes them: the sequence-parallel communication time per step.

DeepSpeed's Ulysses attention (``deepspeed/runtime/sequence_parallel/ulysses_sp.py``) exchanges q, k, v and
the attention output through ``deepspeed.sequence.layer._dim_zero_all_to_all``, a registered operator whose
forward and backward both call ``all_to_all_single`` on that module's ``dist``, which
``ds_bench.measure.comm_timer`` times (how, and why it adds no synchronize, is said there).

Count per micro-step (``CausalLMWorkload.sequence_parallel_all_to_alls``): per layer 4 in forward (q, k, v
gathered to whole sequences of H/S heads; the output scattered back to slices of all heads) and 4 in backward,
4 more with activation checkpointing. Measured on 2 CPU ranks (tiny Llama, 2 layers): 16 per micro-step.
"""

from __future__ import annotations

from ds_bench.measure.comm_timer import CommTimer
from ds_bench.measure.comm_timer import per_step as _per_step

TIMER = "sp_all_to_all"
CALLS = "sp_all_to_all_calls"


def timer(clock) -> CommTimer:
    """This rank's Ulysses all-to-all timer."""
    from deepspeed.sequence import layer

    return CommTimer(clock, layer, "all_to_all_single", TIMER, CALLS)


def per_step(times_s: dict[str, list[float]], step_s: list[float]) -> dict | None:
    """The record's ``sequence_parallel_comm`` from one rank's timers: medians over the measured steps."""
    return _per_step(times_s, step_s, TIMER, CALLS, "all_to_all")
