"""Every report table writes its numbers one way (``ds_bench.report.numbers.number``): thousands separated, a
few significant digits, no scientific notation for the magnitudes a benchmark measures, in the terminal's
tables and the HTML page's alike."""

import re

from ds_bench import cli
from ds_bench.record.schema import RunRecord, ScalingRow
from ds_bench.report import html_runs, scaling_table, summary
from ds_bench.report.numbers import number, ms
from tests.conftest import REPO

SLOW_STEP = {"kind": "run", "workload": "gpt2", "status": "ok", "run_id": "slow",
             "metrics": {"step_ms_median": 11760.4, "step_ms_p90": 12345.6, "samples_per_s": 0.3401,
                         "tokens_per_s": 21765.2}}
SCIENTIFIC = re.compile(r"\d[eE][+-]\d")


def test_a_number_is_thousands_separated_with_four_significant_digits_and_never_scientific():
    cases = {11760.4: "11,760", 8212.4: "8,212", 331.24: "331.2", 1.5: "1.5", 0.0348421: "0.03484", 0: "0",
             1000: "1,000", 2_147_483_648: "2,147,483,648", -3.25: "-3.25", None: "-"}
    assert {v: number(v) for v in cases} == cases
    assert number(0.0348421, 3) == "0.0348" and number(107.2, 3) == "107" and ms(8.2124) == "8,212"
    assert number(1e-7) == "1.000e-07"  # a stray figure far outside what is measured says so


def test_the_terminal_tables_write_a_long_step_as_the_html_does():
    record = RunRecord.model_validate(SLOW_STEP)
    text = summary.table([record])
    assert "11,760" in text and "12,346" in text and not SCIENTIFIC.search(text), text
    row = ScalingRow.model_validate({"world_size": 2, "nodes": 1, "status": "ok", "samples_per_s": 1234.56,
                                     "step_ms_median": 11760.4, "efficiency": 0.9})
    scaling = scaling_table.table([row], 1)
    assert "1,235" in scaling and "11,760" in scaling and not SCIENTIFIC.search(scaling), scaling
    cells = [getattr(c, "text", c) for c in html_runs._run_row(record)]
    assert "11,760" in cells and "21,765" in cells and "0.3401" in cells, cells


def test_no_table_of_the_page_writes_an_ordinary_figure_in_scientific_notation(tmp_path):
    data = REPO / "tests/data/report"
    out = tmp_path / "all.html"
    assert cli.main(["report", "--html", str(out), *map(str, sorted(data.glob("*.jsonl")))]) == 0
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", out.read_text())
    assert cells and [c for c in cells if SCIENTIFIC.search(c)] == []
