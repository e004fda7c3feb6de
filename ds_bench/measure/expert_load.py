"""A mixture-of-experts run's own measurements per step: the MoE all-to-alls (timed where DeepSpeed's MoE layer
calls them: ``ds_bench.measure.layout_comm``) and the router's load balance, from the tokens per expert each
MoE block counted (``ds_bench.engines.moe_layer.MoEBlock.counts``; DeepSpeed's gate counts them before
any dropping).

Each rank keeps, per measured step, the tokens it routed to each expert of each block (summed over the step's
micro-steps) and, with a capacity factor, how many of its routes were dropped (per micro-step and block:
sum_e max(0, count_e - capacity), DeepSpeed's capacity; ``Router.capacity``). Rank 0 sums them over the ranks
(``per_step``): the load balance is the job's tokens per expert, max over mean (1.0: perfectly even), per block,
the worst block of each step taken. Nothing here synchronizes or communicates: the counts are read after the
loop's one synchronize at the end of the step.
"""

from __future__ import annotations

import numpy as np

from ds_bench.measure import layout_comm

TOKENS, DROPPED, ROUTED = "ep_tokens", "ep_dropped", "ep_routed"


class ExpertTimer:
    """``begin`` before a step, ``read`` once it is synchronized (``ds_bench.measure.loop``'s stage-timer surface)."""

    def __init__(self, clock, blocks: list, router, experts: int):
        self.comm = layout_comm.timer("expert_parallel", clock)
        self.blocks, self.router, self.experts = blocks, router, experts

    def begin(self) -> None:
        self.comm.begin()
        for block in self.blocks:
            block.counts.clear()

    def read(self) -> dict[str, float]:
        out = self.comm.read()
        dropped = routed = 0
        for layer, block in enumerate(self.blocks):
            counts = [c.detach().to("cpu").numpy() for c in block.counts]
            per_expert = np.sum(counts, axis=0) if counts else np.zeros(self.experts)
            out.update({f"{TOKENS}.{layer}.{e}": float(n) for e, n in enumerate(per_expert)})
            for c in counts:
                routed += int(c.sum())
                dropped += routes_dropped(c, self.router.capacity(int(c.sum()) // self.router.top_k, self.experts))
        out[DROPPED], out[ROUTED] = float(dropped), float(routed)
        return out


def routes_dropped(counts, capacity: int | None) -> int:
    """Routes past an expert's capacity in one micro-step (pure): sum_e max(0, count_e - capacity)."""
    if capacity is None:
        return 0
    return int(np.maximum(np.asarray(counts) - capacity, 0).sum())


def load_balance(stage_s_of_ranks: list[dict[str, list[float]]]) -> dict | None:
    """From every rank's stage timers: the job's tokens per expert per step, per block max / mean, the worst
    block of each step; median and worst over the measured steps; and the dropped share of all routes (pure)."""
    keys = [k for k in stage_s_of_ranks[0] if k.startswith(TOKENS + ".")]
    if not keys:
        return None
    layers = 1 + max(int(k.split(".")[1]) for k in keys)
    experts = 1 + max(int(k.split(".")[2]) for k in keys)
    steps = len(stage_s_of_ranks[0][keys[0]])
    tokens = np.zeros((steps, layers, experts))
    for stage_s in stage_s_of_ranks:
        for k in keys:
            _, layer, expert = k.split(".")
            tokens[:, int(layer), int(expert)] += np.asarray(stage_s[k], dtype=float)
    mean = tokens.mean(axis=2)
    ratio = np.where(mean > 0, tokens.max(axis=2) / np.where(mean > 0, mean, 1), 1.0).max(axis=1)
    routed = sum(sum(s.get(ROUTED, [])) for s in stage_s_of_ranks)
    dropped = sum(sum(s.get(DROPPED, [])) for s in stage_s_of_ranks)
    return {"load_max_over_mean": float(np.median(ratio)), "load_max_over_mean_worst": float(ratio.max()),
            "dropped_share": dropped / routed if routed else 0.0}
