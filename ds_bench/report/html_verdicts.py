"""Matches judged between two sides, as HTML: ``compare_section`` (one table row per match, worst change first,
with its speed verdict and whether its losses and gradient norms stayed the same, and a bar per match of its median
change in %), the page of ``ds-bench compare --html``; and ``stacks``, the HTML report's section for a study run on
several stacks (``config.stacks``): each stack after the first judged against the first, layout by layout (the
upgrade acceptance's verdict, docs/stacks.md).
"""

from __future__ import annotations

from ds_bench.record.schema import Record
from ds_bench.report.compare_judge import Judged, judge_all
from ds_bench.report.compare_match import samples, stacks_in
from ds_bench.report.html_page import Cell, esc, note, num, section, svg_plot, table

HEADERS = ["measurement", "metric", "base median", "base n", "new median", "new n", "change %",
           "p (one-sided U)", "verdict", "losses, gradient norms"]


def compare_section(judged: list[Judged], summary: str) -> str:
    return section("compare", "Comparison", verdict_parts(judged, summary, "compare-table"))


def verdict_parts(judged: list[Judged], summary: str, table_id: str) -> list[str]:
    """The summary, the table and the plot of ``judged``."""
    rows = [[b.label, f"{b.metric} ({b.unit})", num(v.base_median, key="base_median"), num(len(b.values), "{:d}"),
             num(v.new_median, key="new_median"), num(len(n.values), "{:d}"),
             num(v.change_pct, "{:+.1f}", key="change_pct"), num(v.p_value, digits=3),
             Cell(v.verdict + (" (single sample)" if v.single_sample else ""), cls=v.verdict),
             Cell(c.said if c else "-", cls="" if c is None else ("same" if c.same else "differs"))]
            for b, n, v, c in judged]
    parts = [note(summary), table(HEADERS, rows, table_id)]
    with svg_plot(parts, figsize=(8, 0.9 + 0.35 * len(judged)), title="median change per match") as (_, ax):
        colours = {"slower": "tab:red", "faster": "tab:green", "same": "tab:gray"}
        ax.barh(range(len(judged)), [v.change_pct for _, _, v, _ in judged],
                color=[colours.get(v.verdict, "tab:gray") for _, _, v, _ in judged])
        ax.set_yticks(range(len(judged)), [b.label for b, _, _, _ in judged], fontsize=7)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("median change, % (positive: better)")
        ax.set_title("NEW against BASE")
    return parts


def stacks(records: list[Record]) -> str:
    """Every stack of the records' sweep points and scaling records after the first (in file order) judged against
    the first; empty without two stacks."""
    labels = [s for s in stacks_in(records) if s]
    if len(labels) < 2:
        return ""
    parts = []
    base = samples(records, labels[0])
    for i, label in enumerate(labels[1:], start=1):
        found = judge_all(base, samples(records, label))
        parts.append(f"<h3>{esc(labels[0])} (BASE) against {esc(label)} (NEW)</h3>")
        parts += (verdict_parts(found.judged, found.summary(), f"stacks-table-{i}") if found.judged
                  else [note("no layout measured on both")])
    return section("stacks", "Stacks: the same layouts on each", parts)
