"""``ds-bench report``: the table and plot of a results file, or with ``--html PATH`` one page of any
number of results files (``ds_bench.report.html_report``).

A file of sweep records (``ds-bench sweep``) gets the sweep's ranked table and recommendation
(``ds_bench.report.sweep_report``); a file of scaling records (``ds-bench scaling``) the latest one's
table (``ds_bench.report.scaling_table``); a capacity file the latest search's table
(``ds_bench.report.capacity_table``); a file of run records gets one row per run (``summary.table``).
"""

from __future__ import annotations

import argparse
import os

from ds_bench.config import argcheck
from ds_bench.errors import UserError
from ds_bench.record import store as results
from ds_bench.record.schema import KINDS, RunRecord
from ds_bench.report import plots, summary


def show(results_path: str, tag: str | None, plot_path: str | None) -> int:
    results.check_results_file(results_path)
    argcheck.output_folder("--plot", plot_path)
    records = [r for r in results.read_records(results_path, RunRecord) if tag is None or r.tag == tag]
    if not records:
        raise UserError(f"{results_path}: no records" + (f" with tag {tag}" if tag else ""))
    print(summary.table(records))
    print(f"\nresults: {results_path}" + (f" (tag {tag})" if tag else ""))
    if plot_path and plots.bench_plot(records, plot_path):
        print(f"plot:    {plot_path}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.html:
        if args.tag or args.plot:
            raise UserError("--html takes every record of its files: --tag and --plot are for the terminal report")
        return html(args.results, args.html, getattr(args, "expect_file", None), getattr(args, "expect", None) or "")
    if len(args.results) > 1:
        raise UserError(f"{len(args.results)} results files: the terminal report takes one; "
                        "give --html PATH for one page of them all")
    args.results = args.results[0]
    if os.path.isfile(args.results) and _has_sweep_records(args.results) and args.tag is None:
        from ds_bench.report.sweep_report import report_sweep

        return report_sweep(args.results, write_config=False)
    if os.path.isfile(args.results) and _has_kind(args.results, "scaling") and args.tag is None:
        from ds_bench.report.scaling_table import show_last

        return show_last(args.results)
    if os.path.isfile(args.results) and _has_kind(args.results, "capacity") and args.tag is None:
        from ds_bench.report.capacity_table import show_last as show_capacity

        return show_capacity(args.results)
    if os.path.isfile(args.results) and _has_kind(args.results, "plan") and args.tag is None:
        from ds_bench.report.plan_table import show_last as show_plan

        return show_plan(args.results)
    return show(args.results, args.tag, args.plot)


def html(paths: list[str], out_path: str, expect, expect_path: str) -> int:
    """The page of ``paths`` at ``out_path``, with the outcomes of ``expect`` (the gate's loaded file) when given."""
    from ds_bench.record.expect_check import evaluate
    from ds_bench.report.html_report import read, write_report

    argcheck.output_folder("--html", out_path)
    _check_writable_folder("--html", out_path)
    by_file = read(paths)
    outcomes = evaluate(expect, [r for found in by_file.values() for r in found]) if expect else None
    count = write_report(out_path, by_file, outcomes, expect_path)
    print(f"report: {out_path} ({count} sections from {len(paths)} file(s))")
    return 0


def _check_writable_folder(flag: str, out_path: str) -> None:
    """A file can be created where ``write_page`` makes the page's temporary file (the folder of the
    absolute path): tried now with one empty file, removed at once, so a read-only folder or one of a
    pseudo-filesystem (``/proc``) is refused before any file is read."""
    import tempfile

    folder = os.path.dirname(os.path.abspath(out_path))
    try:
        fd, probe = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=folder)
    except OSError as e:
        raise UserError(f"{flag} {out_path}: cannot create a file in folder {folder} ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def _has_sweep_records(path: str) -> bool:
    return _has_kind(path, "sweep_point")


def _has_kind(path: str, kind: str) -> bool:
    return bool(results.read_records(path, KINDS[kind]))
