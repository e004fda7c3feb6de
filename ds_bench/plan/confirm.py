"""``ds-bench plan --confirm K``: the K best predicted distinct layouts (a layout's micro-batch variants count once)
run for real on these ranks (the studies' runner:
each a fresh ``ds-bench run`` under the plan's launcher, or a Slurm job with ``--executor slurm``), their measured
median step beside the predicted one. A ratio outside ``BAND`` is flagged; a run that fails is the plan's failure
(record ``failed``, exit 1)."""

from __future__ import annotations

import dataclasses
import os
import statistics

from ds_bench.config.deepspeed.derive import write_derived
from ds_bench.config.deepspeed.prepare import load_json
from ds_bench.jobs import runner
from ds_bench.perf.candidate import Candidate
from ds_bench.perf.space import Planned
from ds_bench.plan.spec import PlanSpec
from ds_bench.record.plan_schema import Confirmed, PlanRecord, ScaledTo

BAND = 2.0
"""A prediction within BAND x of its measurement either way is not flagged (docs/plan.md: what was measured)."""


def shape_args(spec: PlanSpec, scaled: ScaledTo | None = None) -> list[str] | None:
    """The ``ds-bench run`` flags that build the plan's model at its sequence length, or ``--scale``'s answer
    (``plan.scale.answer_args``; None: a named size's larger member, which ``ds-bench run`` does not build)."""
    if scaled is not None:
        from ds_bench.plan.scale import answer_args

        return answer_args(spec, scaled)
    return spec.model_flags(spec.seq_len)


def distinct_rows(candidates: list[Candidate], k: int) -> list[int]:
    """The indices of the first ``k`` candidates whose layouts differ beyond micro-batch and accumulation (pure): a
    layout's micro-batch variants are predicted alike, and running two of them confirms one prediction twice."""
    seen, out = set(), []
    for i, c in enumerate(candidates):
        family = (dataclasses.replace(c.layout, grad_accum=1).family, c.checkpointing,  # plan trades mbs for ga
                  c.checkpoint_offload, c.selective)
        if family not in seen:
            seen.add(family)
            out.append(i)
        if len(out) == k:
            break
    return out


def confirm(spec: PlanSpec, record: PlanRecord, ranked: list[Planned]) -> int:
    """Run ``--confirm`` K distinct layouts of the record's rows (``distinct_rows``), fill each one's ``confirmed``;
    1 when any run failed."""
    base = load_json(spec.ds_config)
    folder = os.path.splitext(spec.results)[0] + ".confirm"
    failed = False
    picks = distinct_rows([p.candidate for p in ranked[:len(record.ranked)]], spec.confirm)
    if len(picks) < spec.confirm:
        print(f"confirm: {len(picks)} of --confirm {spec.confirm}: the {len(record.ranked)} row(s) shown (--top) hold "
              f"{len(picks)} distinct layout(s), a layout's micro-batch variants counted once")
    for i in picks:
        row, planned = record.ranked[i], ranked[i]
        layout = planned.candidate.layout
        key = planned.candidate.label(spec.world)
        config = write_derived(os.path.join(folder, runner.slug(key) + ".json"), base, layout)
        tag = runner.new_tag("plan", key)
        extra = (*shape_args(spec, row.scaled), *planned.candidate.option_flags())
        argv = runner.run_argv(spec, tag, config, layout, extra)
        attempt = runner.run_attempt(spec, argv, tag, os.path.join(folder, tag + ".log"))
        row.confirmed = measured(attempt, row.step_s)
        failed |= attempt.status != "ok"
        print(f"confirm {key}: {attempt.status}" + (f" ({attempt.reason})" if attempt.reason else ""))
    ratios = [r.confirmed.ratio for r in record.ranked if r.confirmed and r.confirmed.ratio]
    record.confirm_median_ratio = statistics.median(ratios) if ratios else None
    if failed:
        record.status = "failed"
    return 1 if failed else 0


def measured(attempt: runner.Attempt, predicted_s: float) -> Confirmed:
    run = attempt.run
    step_ms = run.metrics.step_ms_median if run is not None and attempt.status == "ok" else None
    if not step_ms:
        return Confirmed(status=attempt.status, reason=attempt.reason, tag=attempt.tag,
                         run_id=run.run_id if run else None)
    ratio = predicted_s / (step_ms / 1e3)
    return Confirmed(status="ok", tag=attempt.tag, run_id=run.run_id, step_s=step_ms / 1e3,
                     tokens_per_s_per_rank=run.metrics.tokens_per_s / run.world_size
                     if run.metrics.tokens_per_s and run.world_size else None,
                     peak_mem_bytes=run.metrics.peak_mem_bytes, ratio=ratio,
                     flagged=not 1 / BAND <= ratio <= BAND)
