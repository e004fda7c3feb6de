"""``ds-bench compare BASE NEW``: did anything get slower between two results files, or train otherwise?

Runs, sweep points, comm rows and scaling points of the two files are matched by what makes them comparable
(``ds_bench.report.compare_match``); each match gets the change of its medians and a verdict that respects
noise (``ds_bench.report.compare_verdict``: Mann-Whitney U with 3 or more repeats a side, else said to be a
single sample), and, where both sides recorded them, its loss and gradient-norm curves checked step by step
(``ds_bench.report.compare_curves``). ``--stacks A,B``: the sweep points of stack A against those of stack B, of
one file or two (the "did the upgrade get slower, or wrong" table). One table row per match, worst change first;
what only one side holds is counted. Exit 1 when a match is slower or its curves differ, 0 otherwise; 2 on bad
input (a missing file, an unknown stack, nothing to compare).
"""

from __future__ import annotations

import argparse

from tabulate import tabulate

from ds_bench.config import argcheck
from ds_bench.errors import UserError
from ds_bench.record import store
from ds_bench.report.compare_judge import Judged, judge_all
from ds_bench.report.compare_match import Sample, samples, stacks_in
from ds_bench.report.numbers import number


def main(args: argparse.Namespace) -> int:
    if not 0 <= args.threshold < 100:
        raise UserError(f"--threshold {args.threshold:g}: expected a percentage from 0 to below 100")
    if not 0 < args.alpha < 1:
        raise UserError(f"--alpha {args.alpha:g}: expected a probability between 0 and 1")
    argcheck.output_folder("--html", args.html)
    if args.new is None and args.stacks is None:
        raise UserError("NEW is missing: give a second results file, or --stacks A,B to compare two stacks of BASE")
    base_records = _read(args.base, "BASE")
    new_records = base_records if args.new is None else _read(args.new, "NEW")
    base_stack, new_stack = _stacks(args, base_records, new_records)
    base_side, new_side = _side(args.base, base_stack), _side(args.new or args.base, new_stack)
    found = judge_all(samples(base_records, base_stack), samples(new_records, new_stack), args.threshold, args.alpha)
    if not found.judged:
        raise UserError(f"nothing to compare: {base_side} and {new_side} hold no measurement of the same workload, "
                        "layout and ranks (or comm collective and size)")
    print(table(found.judged))
    print("\n" + found.summary())
    if args.html:
        _write_html(args, found.judged, found.summary(), new_records, base_side, new_side)
    return 1 if found.slower or found.differ else 0


def _stacks(args: argparse.Namespace, base_records: list, new_records: list) -> tuple[str | None, str | None]:
    """``--stacks A,B`` checked against the stacks each side's sweep points ran on; (None, None) without it."""
    if args.stacks is None:
        return None, None
    if args.stacks == "":  # --stacks alone: the first two of BASE
        present = [s for s in stacks_in(base_records) if s]
        if len(present) < 2:
            raise UserError(f"--stacks: {args.base} holds {len(present)} stack(s) ({', '.join(present) or 'none'}); "
                            "two are compared")
        print(f"stacks: {present[0]} (BASE) against {present[1]} (NEW)", flush=True)
        return present[0], present[1]
    wanted = [s.strip() for s in args.stacks.split(",")]
    if len(wanted) != 2 or not all(wanted):
        raise UserError(f"--stacks {args.stacks}: expected two stack labels, BASE_STACK,NEW_STACK (e.g. "
                        "ds0.18.4,ds0.19.8)")
    for label, records, path in ((wanted[0], base_records, args.base), (wanted[1], new_records, args.new or args.base)):
        present = [s for s in stacks_in(records) if s]
        if label not in present:
            raise UserError(f"--stacks {args.stacks}: {path} has no sweep point or scaling of stack {label}; its stacks: "
                            f"{', '.join(present) or 'none (a sweep with --deepspeed, --torch or --transformers has)'}")
    return wanted[0], wanted[1]


def _side(path: str, stack: str | None) -> str:
    return path if stack is None else f"{path} (stack {stack})"


def _write_html(args: argparse.Namespace, judged: list, summary: str, new_records: list, base: str, new: str) -> None:
    from ds_bench.record.expect_check import evaluate
    from ds_bench.report import html_compare

    expect = getattr(args, "expect_file", None)  # loaded and checked by the --expect gate
    outcomes = evaluate(expect, new_records) if expect else None
    html_compare.write(args.html, base, new, judged, summary, outcomes, getattr(args, "expect", None) or "")
    print(f"page:    {args.html}")


def _read(path: str, flag: str) -> list:
    store.check_results_file(path, flag)
    return store.read_records(path)


def table(judged: list[Judged]) -> str:
    rows = [[b.label, f"{b.metric} ({b.unit})", _median(v.base_median, b), _median(v.new_median, n),
             f"{v.change_pct:+.1f}%", number(v.p_value, 3),
             v.verdict + (" (single sample)" if v.single_sample else ""), c.said if c else "-"]
            for b, n, v, c in judged]
    return tabulate(rows, headers=["measurement", "metric", "base median (n)", "new median (n)", "change",
                                   "p (one-sided U)", "verdict", "losses, gradient norms"], disable_numparse=True)


def _median(value: float, sample: Sample) -> str:
    return f"{number(value)} ({len(sample.values)})"
