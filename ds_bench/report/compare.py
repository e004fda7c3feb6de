"""``ds-bench compare BASE NEW``: did anything get slower between two results files?

Runs, sweep points, comm rows and scaling points of the two files are matched by what makes them comparable
(``ds_bench.report.compare_match``); each match gets the change of its medians and a verdict that respects
noise (``ds_bench.report.compare_verdict``: Mann-Whitney U with 3 or more repeats a side, else said to be a
single sample). One table row per match, worst change first; what only one file holds is counted.
Exit 1 when a match is slower, 0 otherwise; 2 on bad input (a missing file, nothing to compare).
"""

from __future__ import annotations

import argparse

from tabulate import tabulate

from ds_bench.config import argcheck
from ds_bench.errors import UserError
from ds_bench.record import store
from ds_bench.report.compare_match import Sample, samples
from ds_bench.report.compare_verdict import Verdict, judge
from ds_bench.report.numbers import number


def main(args: argparse.Namespace) -> int:
    if not 0 <= args.threshold < 100:
        raise UserError(f"--threshold {args.threshold:g}: expected a percentage from 0 to below 100")
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha {args.alpha:g}: expected a probability between 0 and 1")
    argcheck.output_folder("--html", args.html)
    base_records, new_records = _read(args.base, "BASE"), _read(args.new, "NEW")
    base, new = samples(base_records), samples(new_records)
    matched = [key for key in base if key in new]
    if not matched:
        raise UserError(f"nothing to compare: {args.base} and {args.new} hold no measurement of the same "
                        "workload, layout and ranks (or comm collective and size)")
    judged = [(base[k], new[k], judge(base[k].values, new[k].values, base[k].higher_is_better, args.threshold,
                                      args.alpha)) for k in matched]
    judged.sort(key=lambda item: item[2].change_pct)
    print(table(judged))
    only = len(base) - len(matched), len(new) - len(matched)
    slower = sum(v.regression for _, _, v in judged)
    summary = (f"{len(matched)} match(es), {slower} slower (threshold {args.threshold:g}%, alpha {args.alpha:g}); "
               f"only in BASE: {only[0]}, only in NEW: {only[1]}")
    print("\n" + summary)
    if args.html:
        _write_html(args, judged, summary, new_records)
    return 1 if slower else 0


def _write_html(args: argparse.Namespace, judged: list, summary: str, new_records: list) -> None:
    from ds_bench.record.expect_check import evaluate
    from ds_bench.report import html_compare

    expect = getattr(args, "expect_file", None)  # loaded and checked by the --expect gate
    outcomes = evaluate(expect, new_records) if expect else None
    html_compare.write(args.html, args.base, args.new, judged, summary, outcomes, getattr(args, "expect", None) or "")
    print(f"page:    {args.html}")


def _read(path: str, flag: str) -> list:
    store.check_results_file(path, flag)
    return store.read_records(path)


def table(judged: list[tuple[Sample, Sample, Verdict]]) -> str:
    rows = [[b.label, f"{b.metric} ({b.unit})", _median(v.base_median, b), _median(v.new_median, n),
             f"{v.change_pct:+.1f}%", number(v.p_value, 3),
             v.verdict + (" (single sample)" if v.single_sample else "")] for b, n, v in judged]
    return tabulate(rows, headers=["measurement", "metric", "base median (n)", "new median (n)", "change",
                                   "p (one-sided U)", "verdict"], disable_numparse=True)


def _median(value: float, sample: Sample) -> str:
    return f"{number(value)} ({len(sample.values)})"
