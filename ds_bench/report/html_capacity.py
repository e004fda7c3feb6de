"""The HTML report's capacity section (``ds-bench capacity`` records): per layout the largest model, or under
``--scale seq`` the longest sequence, that trained (``capacity_table``'s row); a chart of what each search
scaled (parameters, or tokens per sequence); the memory per rank; the searches' bound (the probes that ran out
of memory, no failure: they found the limit); and every probe. A resident peak above the cap is marked and
explained (``capacity_notes``). "" when there is nothing to show.
"""

from __future__ import annotations

from ds_bench.record.schema import CapacityProbeRecord, CapacityRecord
from ds_bench.report.capacity_notes import ABOVE_CAP_NOTE, above_cap, bound_lines, peak_text
from ds_bench.report.capacity_table import HEADERS, SEQ_HEADERS, params_text, row
from ds_bench.report.html_page import Cell, heading, note, num, section, status, svg_plot, table

GIB = 2**30
PROBE_HEADERS = ["search", "layout", "member", "params", "status", "peak GiB", "step s", "reason"]


def capacity(records: list[CapacityRecord], probes: list[CapacityProbeRecord] = ()) -> str:
    if not records and not probes:
        return ""
    latest = list({(r.capacity, r.layout): r for r in records}.values())  # the latest answer per search and layout
    parts = [_answers(latest)] if latest else []
    for seq in (False, True):
        _chart(parts, [r for r in latest if r.largest and (r.scale == "seq") == seq], seq)
    caps = sorted({r.capacity_bytes for r in [*latest, *probes] if r.capacity_bytes})
    if caps:
        parts.append(note("memory per rank: " + ", ".join(f"{c / GIB:.2f} GiB" for c in caps)))
    parts += [note(line) for line in bound_lines(list(probes))]
    if any(above_cap(r.largest and r.largest.peak_mem_bytes, r.capacity_bytes) for r in latest) or any(
            above_cap(p.peak_mem_bytes, p.capacity_bytes) for p in probes):
        parts.append(note(ABOVE_CAP_NOTE))
    if probes:
        parts.append(heading(f"the searches' {len(probes)} probe(s)"))
        parts.append(table(PROBE_HEADERS, [_probe_row(p) for p in probes], "capacity-probes-table"))
    return section("capacity", "Capacity and layouts", parts)


def _answers(records: list[CapacityRecord]) -> str:
    headers = SEQ_HEADERS if any(r.scale == "seq" for r in records) else HEADERS
    at = headers.index("params")
    rows = []
    for r in records:
        cells: list = row(r)
        cells[at] = Cell(cells[at], r.largest.params if r.largest else None, key="params")
        rows.append(cells)
    return table(headers, rows, "capacity-table")


def _chart(parts: list[str], records: list[CapacityRecord], seq: bool) -> None:
    """One bar per layout: the longest sequence that trained (tokens), or the largest model's parameters."""
    values = [r.largest.seq_len if seq else r.largest.params for r in records]
    shown = [(r, v) for r, v in zip(records, values) if v]
    if not shown:
        return
    what = "longest sequence per layout" if seq else "largest model per layout"
    with svg_plot(parts, figsize=(7, 0.8 + 0.45 * len(shown)), title=what) as (_, ax):
        ax.barh(range(len(shown)), [v if seq else v / 1e6 for _, v in shown], color="tab:green")
        ax.set_yticks(range(len(shown)), [f"{r.world_size} ranks {r.layout}" for r, _ in shown], fontsize=8)
        ax.set_xlabel("longest sequence that trained (tokens)" if seq
                      else "parameters of the largest member that trained (millions)")
        ax.set_title("Longest sequence per layout" if seq else "Capacity per layout")


def _probe_row(p: CapacityProbeRecord) -> list:
    """An out-of-memory probe is the search's bound, not a failure: said so, and not in a failure's red."""
    state = Cell("oom: over the limit", cls="bound") if p.status == "oom" else status(p.status)
    peak = Cell(peak_text(p.peak_mem_bytes, p.capacity_bytes if above_cap(p.peak_mem_bytes, p.capacity_bytes) else None),
                p.peak_mem_bytes, key="probe_peak") if p.peak_mem_bytes else "-"
    return [p.capacity, p.layout, p.member, Cell(params_text(p.params), p.params, key="probe_params"), state, peak,
            num(p.step_s, digits=3), p.reason or ""]
