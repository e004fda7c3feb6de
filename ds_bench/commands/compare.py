"""``ds-bench compare BASE NEW``: did anything get slower between two results files, with a noise-aware
verdict (``ds_bench.report.compare``; the test in ``ds_bench.report.compare_verdict``), and did the same layout
train the same way (its loss and gradient-norm curves, ``ds_bench.report.compare_curves``); exit 1 when slower
or different::

    ds-bench compare results/before.jsonl results/after.jsonl --threshold 5
    ds-bench compare results/sweep.jsonl --stacks ds0.18.4,ds0.19.8   # two stacks of one sweep
"""

from __future__ import annotations

import argparse

from ds_bench.report.compare_verdict import DEFAULT_ALPHA, DEFAULT_THRESHOLD_PCT


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("base", help="results file of the reference (JSON lines of any ds-bench command)")
    p.add_argument("new", nargs="?", default=None,
                   help="results file to judge against it (with --stacks, default: BASE itself)")
    p.add_argument("--stacks", default=None, nargs="?", const="", metavar="BASE_STACK,NEW_STACK",
                   help="compare a study's points of two stacks (their key's stack= word, e.g. ds0.18.4,ds0.19.8: "
                        "--deepspeed/--torch/--transformers of sweep, capacity, scaling), layout by layout; without a "
                        "value, the first two stacks of BASE in file order")
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD_PCT, metavar="PCT",
                   help=f"a change within this many percent is not called (default {DEFAULT_THRESHOLD_PCT:g})")
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                   help=f"significance level of the Mann-Whitney U test (default {DEFAULT_ALPHA:g})")
    p.add_argument("--html", default=None, metavar="PATH", help="also write the comparison as a self-contained page")


def main(args: argparse.Namespace) -> int:
    from ds_bench.report.compare import main as compare_files

    return compare_files(args)
