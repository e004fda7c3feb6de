"""A sweep's outputs from its records, beside the results file: the ranked table (``.md``, ``.csv``,
and on the terminal), the recommendation line, the winning DeepSpeed config (``-recommended.json``:
the resolved config of the recommended point with its per-device micro-batch and accumulation, and no
``train_batch_size``, so ``ds-bench run --ds-config`` and ``deepspeed.initialize`` take it as it is at
any world size) and the plots (``-*.png``). Used by ``ds-bench sweep`` at its
end and by ``ds-bench report``.
"""

from __future__ import annotations

import os

from ds_bench.config.deepspeed.prepare import portable, write_config
from ds_bench.errors import UserError
from ds_bench.jobs.outcome import was_busy
from ds_bench.record import store as results
from ds_bench.record.schema import SweepPointRecord
from ds_bench.report import ranking as rank
from ds_bench.report.point_cost import point_cost
from ds_bench.report import sweep_plots as plots
from ds_bench.report import sweep_table as table


def report_sweep(results_path: str, sweep_id: str | None = None, headroom_pct: float = 10.0,
           baseline: str | None = None, write_config: bool = True) -> int:
    records = results.read_records(results_path, SweepPointRecord)
    if sweep_id is None and records:
        sweep_id = records[-1].sweep
    records = [r for r in records if r.sweep == sweep_id]
    if not records:
        raise UserError(f"{results_path}: no sweep records" + (f" of sweep {sweep_id}" if sweep_id else ""))
    keys = {r.key for r in records}
    if baseline is not None and baseline not in keys:
        raise UserError(f"--baseline {baseline!r}: no such point in this sweep; points: {', '.join(sorted(keys))}")
    unit = next((r.unit for r in records if r.status == "ok"), records[0].unit or "samples/s")
    ranking = rank.rank(rank.summarize_points(records), baseline_key=baseline, headroom_pct=headroom_pct)
    stem = os.path.splitext(results_path)[0]
    latest = [a for attempts in rank.latest_attempts(records).values() for a in attempts if a.status == "ok"]
    with open(stem + ".md", "w", encoding="utf-8") as f:
        f.write(table.markdown(ranking, unit))
        if (cost := point_cost(latest, "github")) is not None:
            f.write(f"\n{cost}\n")
    table.write_csv(ranking, stem + ".csv")
    print("\n" + table.terminal(ranking, unit))
    if (cost := point_cost(latest)) is not None:
        print("\n" + cost)
    busy = sorted({r.key for r in records if was_busy(r, os.cpu_count())})
    if busy:
        print(f"warning: the machine was busy during {len(busy)} point(s) ({', '.join(busy[:5])}"
              f"{', ...' if len(busy) > 5 else ''}): other processes used CPU or GPU time; their figures may be low")
    print("\n" + rank.recommendation_line(ranking, unit))
    if ranking.recommended is not None and ranking.recommended.ds_config and write_config:
        world = next((r.world_size for r in records if r.key == ranking.recommended.key), None)
        print(write_recommended(stem + "-recommended.json", ranking.recommended.ds_config, world,
                                ranking.recommended.point.engine))
    print(f"table:   {stem}.md, {stem}.csv")
    for path in plots.write_plots(ranking, stem):
        print(f"plot:    {path}")
    return 0 if ranking.recommended is not None else 1


def write_recommended(path: str, ds_cfg: dict, world_size: int | None, engine: str) -> str:
    """Write the winning config as a job of any size takes it (``portable``); the line saying where,
    the per-device batch it fixes and the world size it was measured at."""
    write_config(path, portable(ds_cfg))
    at = f", measured at {world_size} rank(s)" if world_size else ""
    how = f"; run it with --engine {engine}" if engine != "deepspeed" else ""
    return (f"config:  {path} (per device: micro-batch {ds_cfg['train_micro_batch_size_per_gpu']} x accumulation "
            f"{ds_cfg['gradient_accumulation_steps']}{at}; train_batch_size follows the world size{how})")
