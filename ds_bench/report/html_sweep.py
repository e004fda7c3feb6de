"""The HTML report's answers: the sweep (its ranked table, the Pareto plot and the recommended DeepSpeed
config as a download), capacity and layouts (the largest model per layout) and the expectations (pass /
fail / not measured against the records shown).

The sweep's verdict is ``ds_bench.report.ranking``'s, the same as the terminal's; the recommended config
is written as ``ds-bench sweep`` writes it (``portable``). "" when there is nothing to show.
"""

from __future__ import annotations

from ds_bench.config.deepspeed.prepare import portable
from ds_bench.record.expect_check import Outcome, measured_text, summary_line
from ds_bench.record.schema import CapacityProbeRecord, CapacityRecord, SweepPointRecord
from ds_bench.report import ranking as rank
from ds_bench.report import sweep_table
from ds_bench.report.capacity_table import HEADERS as CAPACITY_HEADERS
from ds_bench.report.capacity_table import params_text
from ds_bench.report.capacity_table import row as capacity_row
from ds_bench.report.html_page import Cell, download, esc, heading, note, num, section, status, svg_plot, table
from ds_bench.report.ranking import GIB
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
    pipeline = sweep_table.has_pipeline(ranking)
    headers = sweep_table.headers(unit, pipeline)
    at = {name: headers.index(name) for name in ("status", f"median {unit}", "peak GiB")}
    rows = []
    for r in ranking.rows:
        cells: list = list(sweep_table.cells(ranking, r, pipeline))
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


def capacity(records: list[CapacityRecord], probes: list[CapacityProbeRecord] = ()) -> str:
    if not records and not probes:
        return ""
    latest = {}
    for r in records:  # the latest answer per (search, layout)
        latest[(r.capacity, r.layout)] = r
    rows = []
    for r in latest.values():
        cells: list = capacity_row(r)
        params = r.largest.params if r.largest else None
        column = CAPACITY_HEADERS.index("params")
        cells[column] = Cell(cells[column], params, key="params")
        rows.append(cells)
    parts = [table(CAPACITY_HEADERS, rows, "capacity-table")] if rows else []
    ok = [r for r in latest.values() if r.largest and r.largest.params]
    if ok:
        with svg_plot(parts, figsize=(7, 0.8 + 0.45 * len(ok)), title="largest model per layout") as (_, ax):
            labels = [f"{r.world_size} ranks {r.layout}" for r in ok]
            ax.barh(range(len(ok)), [r.largest.params / 1e6 for r in ok], color="tab:green")
            ax.set_yticks(range(len(ok)), labels, fontsize=8)
            ax.set_xlabel("parameters of the largest member that trained (millions)")
            ax.set_title("Capacity per layout")
    caps = sorted({r.capacity_bytes for r in [*latest.values(), *probes] if r.capacity_bytes})
    if caps:
        parts.append(note("memory per rank: " + ", ".join(f"{c / GIB:.2f} GiB" for c in caps)))
    if probes:
        parts.append(heading(f"the searches' {len(probes)} probe(s)"))
        parts.append(table(["search", "layout", "member", "params", "status", "peak GiB", "step s", "reason"],
                           [[p.capacity, p.layout, p.member, Cell(params_text(p.params), p.params, key="probe_params"),
                             status(p.status), num(p.peak_mem_bytes, "{:.2f}", scale=GIB), num(p.step_s, digits=3),
                             p.reason or ""] for p in probes], "capacity-probes-table"))
    return section("capacity", "Capacity and layouts", parts)


def expectations(outcomes: list[Outcome], source: str) -> str:
    if not outcomes:
        return ""
    rows = [[status(o.status), o.expectation.name, f"{o.expectation.kind}.{o.expectation.metric}",
             o.expectation.bound_text(), Cell(measured_text(o), o.measured, key="measured"),
             o.expectation.source or ""] for o in outcomes]
    return section("expectations", "Expectations", [note(summary_line(outcomes, source)), table(
        ["result", "expectation", "metric", "expected", "measured", "source"], rows, "expectations-table")])
