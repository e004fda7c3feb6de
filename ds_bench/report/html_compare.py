"""``ds-bench compare --html PATH``: the comparison as a page of the HTML report's kind (``html_verdicts``), with
the expectations' outcomes on NEW when ``--expect`` is given."""

from __future__ import annotations

from ds_bench.record.expect_check import Outcome
from ds_bench.report.compare_judge import Judged
from ds_bench.report.html_report import write_page
from ds_bench.report.html_sweep import expectations
from ds_bench.report.html_verdicts import compare_section

def write(path: str, base: str, new: str, judged: list[Judged], summary: str,
          outcomes: list[Outcome] | None, expect_path: str) -> None:
    parts = [("compare", "Comparison", compare_section(judged, summary))]
    if outcomes:
        parts.append(("expectations", "Expectations", expectations(outcomes, expect_path)))
    write_page(path, "ds_bench comparison", f"BASE {base} against NEW {new}", parts)
