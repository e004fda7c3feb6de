"""What a run's parallel degrees measure, for the loop and for the record: the step's timers of every active
degree (``timers``) and, from the ranks' reports, each degree's record block (``blocks``): its size and settings
(the plan's), its own collectives in one shape (``ds_bench.measure.layout_comm.per_step``) and, for a degree that
routes tokens, the experts' load balance (``ds_bench.measure.expert_load``). The degrees are the run's mesh
(``ds_bench.engines.degrees.mesh``); nothing here names one.
"""

from __future__ import annotations

from ds_bench.engines import moe_layer
from ds_bench.measure import expert_load, layout_comm, stage_timers


class StepTimers:
    """Several degrees' timers behind the loop's one timer surface: ``begin`` each, ``read`` them all."""

    stage = None

    def __init__(self, timers: list):
        self.timers = timers

    def begin(self) -> None:
        for timer in self.timers:
            timer.begin()

    def read(self) -> dict[str, float]:
        out = {}
        for timer in self.timers:
            out.update(timer.read())
        return out


def timers(mesh, engine, clock, workload):
    """The timers the loop begins and reads around each step (None: no degree times anything): a staged model's
    instruction timers (``stage_timers``), else each degree's collectives and token routing."""
    if mesh.staged is not None:
        return stage_timers.StageTimers(engine, clock)
    found = []
    for plan in mesh.plans:
        blocks = moe_layer.moe_blocks(engine.module) if plan.routes_tokens else []
        if blocks:
            found.append(expert_load.ExpertTimer(clock, blocks, workload.router, workload.experts))
        elif plan.comm_timed and plan.size > 1:
            found.append(layout_comm.timer(plan.field, clock))
    return found[0] if len(found) == 1 else StepTimers(found) if found else None


def blocks(mesh, reports: list) -> dict[str, dict] | None:
    """The record's ``degrees`` map (``ds_bench.record.run_blocks.DegreeBlock``): each degree's size and settings,
    rank 0's ``comm`` (medians over the measured steps) and, routing tokens, the job's load balance."""
    out = mesh.record_blocks()
    first = reports[0]
    for plan in mesh.plans:
        block = out[plan.field]
        block["comm"] = layout_comm.per_step(plan.field, first.stage_s, first.step_s) if first.stage_s else None
        if plan.routes_tokens and first.stage_s:
            block["measured"] = expert_load.load_balance([r.stage_s for r in reports])
    return out
