"""``ds-bench compare --html PATH``: the comparison as a page of the HTML report's kind (one table row per
match, worst change first, with its speed verdict and whether its losses and gradient norms stayed the same,
and a bar per match of its median change in %), with the expectations' outcomes on NEW when ``--expect`` is
given."""

from __future__ import annotations

from ds_bench.record.expect_check import Outcome
from ds_bench.report.compare_curves import CurveCheck
from ds_bench.report.compare_match import Sample
from ds_bench.report.compare_verdict import Verdict
from ds_bench.report.html_page import Cell, note, num, section, svg_plot, table
from ds_bench.report.html_report import write_page
from ds_bench.report.html_sweep import expectations

HEADERS = ["measurement", "metric", "base median", "base n", "new median", "new n", "change %",
           "p (one-sided U)", "verdict", "losses, gradient norms"]
Judged = tuple[Sample, Sample, Verdict, CurveCheck | None]


def compare_section(judged: list[Judged], summary: str) -> str:
    rows = [[b.label, f"{b.metric} ({b.unit})", num(v.base_median, key="base_median"), num(len(b.values), "{:d}"),
             num(v.new_median, key="new_median"), num(len(n.values), "{:d}"),
             num(v.change_pct, "{:+.1f}", key="change_pct"), num(v.p_value, digits=3),
             Cell(v.verdict + (" (single sample)" if v.single_sample else ""), cls=v.verdict),
             Cell(c.said if c else "-", cls="" if c is None else ("same" if c.same else "differs"))]
            for b, n, v, c in judged]
    parts = [note(summary), table(HEADERS, rows, "compare-table")]
    with svg_plot(parts, figsize=(8, 0.9 + 0.35 * len(judged)), title="median change per match") as (_, ax):
        colours = {"slower": "tab:red", "faster": "tab:green", "same": "tab:gray"}
        ax.barh(range(len(judged)), [v.change_pct for _, _, v, _ in judged],
                color=[colours.get(v.verdict, "tab:gray") for _, _, v, _ in judged])
        ax.set_yticks(range(len(judged)), [b.label for b, _, _, _ in judged], fontsize=7)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.invert_yaxis()
        ax.set_xlabel("median change, % (positive: better)")
        ax.set_title("NEW against BASE")
    return section("compare", "Comparison", parts)


def write(path: str, base: str, new: str, judged: list[Judged], summary: str,
          outcomes: list[Outcome] | None, expect_path: str) -> None:
    parts = [("compare", "Comparison", compare_section(judged, summary))]
    if outcomes:
        parts.append(("expectations", "Expectations", expectations(outcomes, expect_path)))
    write_page(path, "ds_bench comparison", f"BASE {base} against NEW {new}", parts)
