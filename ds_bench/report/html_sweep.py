"""The HTML report's answers: the sweep (its ranked table, the Pareto plot and the recommended DeepSpeed
config as a download) and the expectations (pass / fail / not measured against the records shown); capacity
is ``html_capacity``'s.

The sweep's verdict is ``ds_bench.report.ranking``'s, the same as the terminal's; the recommended config
is written as ``ds-bench sweep`` writes it (``portable``). "" when there is nothing to show.
"""

from __future__ import annotations

from ds_bench.config.deepspeed.prepare import portable
from ds_bench.record.expect_check import Outcome, measured_text, summary_line
from ds_bench.record.schema import SweepPointRecord
from ds_bench.report import ranking as rank
from ds_bench.report import sweep_table
from ds_bench.report.html_page import Cell, download, esc, heading, note, section, status, svg_plot, table
from ds_bench.report.sweep_plots import pareto_plot


def sweep(records: list[SweepPointRecord]) -> str:
    if not records:
        return ""
    parts = []
    sweeps = list(dict.fromkeys(r.sweep for r in records))
    for sweep_id in sweeps:
        mine = [r for r in records if r.sweep == sweep_id]
        parts += _one_sweep(sweep_id, mine)
    return section("sweep", "Sweep", parts)


def _one_sweep(sweep_id: str, records: list[SweepPointRecord]) -> list[str]:
    unit = next((r.unit for r in records if r.status == "ok" and r.unit), records[0].unit or "samples/s")
    ranking = rank.rank(rank.summarize_points(records))
    first = records[0]
    parts = [heading(f"sweep {sweep_id}: {first.workload}{'/' + first.size if first.size else ''}, "
                     f"{first.world_size} rank(s), {len(ranking.rows)} point(s)")]
    pipeline, numerics = sweep_table.has_pipeline(ranking), sweep_table.has_numerics(ranking)
    headers = sweep_table.headers(unit, pipeline, numerics)
    at = {name: headers.index(name) for name in ("status", f"median {unit}", "peak GiB")}
    rows = []
    for r in ranking.rows:
        cells: list = list(sweep_table.cells(ranking, r, pipeline, numerics))
        cells[at["status"]] = status(r.status)
        cells[at[f"median {unit}"]] = Cell(cells[at[f"median {unit}"]], r.throughput_median, key="throughput")
        cells[at["peak GiB"]] = Cell(cells[at["peak GiB"]], r.peak_mem_bytes, key="peak_mem_bytes")
        rows.append(cells)
    parts.append(table(headers, rows, f"sweep-table-{sweep_id}"))
    parts.append(f'<p class="recommendation"><strong>{esc(rank.recommendation_line(ranking, unit))}</strong></p>')
    best = ranking.recommended
    if best is not None and best.ds_config:
        parts.append(download(f"{sweep_id}-recommended.json", portable(best.ds_config),
                              f"download the recommended DeepSpeed config ({best.key})"))
    if any(r.ran_ok and r.peak_mem_bytes for r in ranking.rows):
        with svg_plot(parts, figsize=(7, 4), title="throughput against peak memory") as (_, ax):
            pareto_plot(ax, ranking.rows, best, unit)
    parts.append(note(sweep_table.LEGEND))
    return parts


def expectations(outcomes: list[Outcome], source: str) -> str:
    if not outcomes:
        return ""
    rows = [[status(o.status), o.expectation.name, f"{o.expectation.kind}.{o.expectation.metric}",
             o.expectation.bound_text(), Cell(measured_text(o), o.measured, key="measured"),
             o.expectation.source or ""] for o in outcomes]
    return section("expectations", "Expectations", [note(summary_line(outcomes, source)), table(
        ["result", "expectation", "metric", "expected", "measured", "source"], rows, "expectations-table")])
