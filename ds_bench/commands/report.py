"""``ds-bench report``: the table (and plot) of a results file; ``--html PATH``: one page of any number of
results files (``ds_bench.report.main``)::

    ds-bench report results/results.jsonl --plot results/bench.png
    ds-bench report results/*.jsonl --html results/report.html
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="*", default=["results/results.jsonl"],
                   help="results files (JSON lines of any ds-bench command); several only with --html")
    p.add_argument("--tag", default=None, help="only records with this tag")
    p.add_argument("--plot", default=None, help="write a PNG plot here")
    p.add_argument("--html", default=None, metavar="PATH",
                   help="write one self-contained HTML page of every results file given (works offline)")


def main(args: argparse.Namespace) -> int:
    from ds_bench.report.main import main as show_report

    return show_report(args)
