"""``ds-bench sweep`` (and ``ds-bench bench``, its preset): run the sweep, then report it.

``report`` turns a sweep's records into the outputs beside the results file: the ranked table
(``.md``, ``.csv``, and on the terminal), the recommendation line, the winning DeepSpeed config
(``-recommended.json``: the resolved config of the recommended point, which ``ds-bench run
--ds-config`` and ``deepspeed.initialize`` take as it is) and the plots (``-*.png``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os

from ds_bench.errors import UserError
from ds_bench.sweep import ledger

log = logging.getLogger("ds_bench")


def main(args: argparse.Namespace) -> int:
    import torch

    from ds_bench.machine.cpu_features import this_cpu_has_native_bf16
    from ds_bench.sweep import driver
    from ds_bench.sweep.spec import from_args

    gpu = torch.cuda.is_available()
    spec, base = from_args(args, list(args.run_args), gpu, gpu or this_cpu_has_native_bf16())
    for note in spec.notes:
        print(note, flush=True)
    _check_baseline(spec)
    sweep = driver.Sweep(spec, base)
    if args.dry_run:
        print(plan_text(sweep))
        return 0
    done_before = len(sweep.done)
    print(f"sweep {sweep.sweep_id}: {spec.workload}, {sweep.world} rank(s), results {spec.results}"
          + (f" ({done_before} attempt(s) recorded before: finished points are kept)" if done_before else ""),
          flush=True)
    driver.sigterm_as_interrupt()
    try:
        sweep.run()
    except KeyboardInterrupt:
        kept = len(ledger.load(spec.results, sweep.sweep_id))
        print(f"\nsweep interrupted: {kept} attempt(s) recorded in {spec.results}; "
              "re-run the same command to go on from there", flush=True)
        return 130
    return report(spec.results, sweep.sweep_id, spec.headroom_pct, spec.baseline)


def _check_baseline(spec) -> None:
    """A baseline must be a point the sweep can have (with ``auto`` micro-batches, checked at the end)."""
    from ds_bench.jobs.points import grid

    if spec.baseline is None or spec.micro_batches is None:
        return
    keys = [p.key for p in grid(spec.stages, spec.offloads, spec.precisions, spec.micro_batches, spec.grad_accums,
                                spec.engines)]
    keys += [p.key for p in spec.extra_points]
    if spec.baseline not in keys:
        raise UserError(f"--baseline {spec.baseline!r}: not a point of this sweep; points: {', '.join(keys)}")


def plan_text(sweep) -> str:
    from ds_bench.jobs.points import families, invalid_reason

    s = sweep.spec
    lines = [f"families (micro-batch {'auto' if s.micro_batches is None else ','.join(map(str, s.micro_batches))}, "
             f"{s.repeats} repeat(s) each):"]
    for f in families(s.stages, s.offloads, s.precisions, s.grad_accums, s.engines):
        why = invalid_reason(f.with_micro_batch(1), s.device_type)
        lines.append(f"  {f.family_label()}" + (f"  skipped: {why}" if why else ""))
    lines += [f"  point {p.key}" + (f"  skipped: {w}" if (w := invalid_reason(p, s.device_type)) else "")
              for p in s.extra_points]
    return "\n".join(lines)


def report(results_path: str, sweep_id: str | None = None, headroom_pct: float = 10.0,
           baseline: str | None = None, write_config: bool = True) -> int:
    from ds_bench.record import store as results
    from ds_bench.report import ranking as rank
    from ds_bench.report import sweep_plots as plots
    from ds_bench.report import sweep_table as table

    records = [r for r in results.read_records(results_path) if r.get("kind") == "sweep_point"]
    if sweep_id is None and records:
        sweep_id = records[-1]["sweep"]
    records = [r for r in records if r["sweep"] == sweep_id]
    if not records:
        raise UserError(f"{results_path}: no sweep records" + (f" of sweep {sweep_id}" if sweep_id else ""))
    keys = {r["key"] for r in records}
    if baseline is not None and baseline not in keys:
        raise UserError(f"--baseline {baseline!r}: no such point in this sweep; points: {', '.join(sorted(keys))}")
    unit = next((r["unit"] for r in records if r.get("status") == "ok"), records[0].get("unit") or "samples/s")
    ranking = rank.rank(rank.summarize_points(records), baseline_key=baseline, headroom_pct=headroom_pct)
    stem = os.path.splitext(results_path)[0]
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(table.markdown(ranking, unit))
    table.write_csv(ranking, stem + ".csv")
    print("\n" + table.terminal(ranking, unit))
    busy = sorted({r["key"] for r in records if rank.was_busy(r, os.cpu_count())})
    if busy:
        print(f"warning: the machine was busy during {len(busy)} point(s) ({', '.join(busy[:5])}"
              f"{', ...' if len(busy) > 5 else ''}): other processes used CPU or GPU time; their figures may be low")
    print("\n" + rank.recommendation_line(ranking, unit))
    if ranking.recommended is not None and ranking.recommended.ds_config and write_config:
        path = stem + "-recommended.json"
        with open(path, "w", encoding="utf-8") as f:
            json.dump(ranking.recommended.ds_config, f, indent=2)
        engine = ranking.recommended.point.engine
        print(f"config:  {path}" + (f" (run it with --engine {engine})" if engine != "deepspeed" else ""))
    print(f"table:   {stem}.md, {stem}.csv")
    for path in plots.write_plots(ranking, stem):
        print(f"plot:    {path}")
    return 0 if ranking.recommended is not None else 1
