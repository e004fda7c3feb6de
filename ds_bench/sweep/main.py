"""``ds-bench sweep`` (and ``ds-bench bench``, its preset): run the sweep, then report it.

The outputs beside the results file (ranked table, recommendation, winning config, plots) are
``ds_bench.report.sweep_report``'s, shared with ``ds-bench report``.
"""

from __future__ import annotations

import argparse
import logging

from ds_bench.errors import UserError
from ds_bench.jobs.runner import INTERRUPTED, check_cluster, executor_line, until_interrupted
from ds_bench.jobs.stack_axis import prepare_stacks, stack_lines
from ds_bench.report.sweep_report import report_sweep

log = logging.getLogger("ds_bench")


def main(args: argparse.Namespace) -> int:
    from ds_bench.jobs.compute_nodes import for_study
    from ds_bench.sweep import driver
    from ds_bench.sweep.spec import from_args

    node = for_study(args)
    print(node.line(), flush=True)
    spec, base = from_args(args, list(args.run_args), node)
    for note in spec.notes:
        print(note, flush=True)
    _check_baseline(spec)
    if not args.dry_run:
        check_cluster(spec)  # before the memory per rank is asked of the nodes Slurm describes
    sweep = driver.Sweep(spec, base)
    _check_runnable(sweep)
    if args.dry_run:
        print(dry_run_text(sweep))
        return 0
    prepare_stacks(spec)
    done_before = len(sweep.done)
    print(f"sweep {sweep.sweep_id}: {spec.workload}, {sweep.world} rank(s), results {spec.results}"
          + (f" ({done_before} attempt(s) recorded before: finished points are kept)" if done_before else ""),
          flush=True)
    finished, _ = until_interrupted(sweep.run, lambda: (
        f"sweep interrupted: {len(driver.load_ledger(spec.results, sweep.sweep_id))} attempt(s) recorded in "
        f"{spec.results}; re-run the same command to go on from there"))
    if not finished:
        return INTERRUPTED
    return report_sweep(spec.results, sweep.sweep_id, spec.headroom_pct, spec.baseline)


def _check_baseline(spec) -> None:
    """A baseline must be a point the sweep can have (with ``auto`` micro-batches, checked at the end)."""
    if spec.baseline is None or spec.micro_batches is None:
        return
    keys = [f.with_micro_batch(m).key for f in spec.families() for m in sorted(spec.micro_batches)]
    keys += [p.key for p in spec.extra_points]
    if spec.baseline not in keys:
        raise UserError(f"--baseline {spec.baseline!r}: not a point of this sweep; points: {', '.join(keys)}")


def _check_runnable(sweep) -> None:
    """A sweep whose every family and point the legality table refuses at its ranks is bad input (exit 2, before
    anything runs: ``perf.grid.runnable``); one with some left skips the others, each with its reason."""
    from ds_bench.perf.grid import runnable

    s = sweep.spec
    points = [sweep.with_seq(f.with_micro_batch(1)) for f in s.families()] + [sweep.with_seq(p) for p in s.extra_points]
    runnable(points, sweep.where, "point")


def dry_run_text(sweep) -> str:
    from ds_bench.perf.grid import skip_reason

    s = sweep.spec
    lines = [f"families (micro-batch {'auto' if s.micro_batches is None else ','.join(map(str, s.micro_batches))}, "
             f"{s.repeats} repeat(s) each):"]
    for f in s.families():
        why = skip_reason(sweep.with_seq(f.with_micro_batch(1)), sweep.where_of(f))
        lines.append(f"  {f.family_label()}" + (f"  skipped: {why}" if why else ""))
    lines += [f"  point {p.key}" + (f"  skipped: {w}" if (w := skip_reason(sweep.with_seq(p), sweep.where_of(p)))
                                   else "") for p in s.extra_points]
    lines += stack_lines(s.stacks)
    if sweep.pruning is not None:
        from ds_bench.sweep.prune import summary

        lines += summary(sweep.pruning)
    slurm = executor_line(s, len(s.families()), "point (families at once)")
    return "\n".join([*lines, slurm] if slurm else lines)
