"""What every point of a sweep runs with beyond its layout: ``--size``, ``--seq-len`` (one value), ``--data`` and
the ``run`` options after ``--``, checked by ``run``'s own parser; the options the sweep sets per point are refused
after ``--``.

``--seq-len`` with one value passes to every point as a run option, as it did before it could be an axis (so
those sweeps' ids and ledgers are unchanged); with several it is an axis: each family's ``Layout.seq_len``,
``seq=N`` in its points' keys (``seq_axis``); a point with its own runs without the one value (``seq_arg``,
``without_seq``).
"""

from __future__ import annotations

import argparse

from ds_bench.config.parsers import flag_type, parse_count, parse_list
from ds_bench.config.run_flags import parse_run_tail
from ds_bench.errors import UserError
from ds_bench.config.study_flags import axis_flags

OWNED = {"micro_batch": "--micro-batch", "steps": "--steps", "warmup": "--warmup", "results": "--results",
         "tag": "--tag", "cpu_mem_limit": "--cpu-mem-limit", "engine": "--engine", "attn": "--attn",
         "compile": "--compile"}
"""Run options the sweep sets per point (its job flags and these axes; the degrees' and switches' are
``jobs.flags.axis_flags``); ``--seq-len`` too where the sweep has its own."""


def seq_lens_of(text) -> tuple[int, ...]:
    """``--seq-len``'s values, each a count (``8k`` = 8192), repeats dropped; () when not given (pure)."""
    return parse_list("--seq-len", str(text), kind=flag_type(parse_count, "--seq-len")) if text is not None else ()


def seq_axis(text) -> tuple[int, ...]:
    """The families' ``seq_len`` values: the list when ``--seq-len`` has several, else (0,): none, or the one
    value, which is a run argument (pure)."""
    values = seq_lens_of(text)
    return values if len(values) > 1 else (0,)


def common_run_args(args: argparse.Namespace, tail: list[str]) -> tuple[str, ...]:
    """``--size``, one ``--seq-len``, ``--data`` (as given to the sweep), then the ``--`` tail: the run arguments
    of every point, in that order."""
    seq_lens = seq_lens_of(args.seq_len)
    own = []
    for flag, value in (("--size", args.size), ("--seq-len", seq_lens[0] if len(seq_lens) == 1 else None),
                        ("--data", args.data)):
        if value is not None:
            own += [flag, str(value)]
    try:
        _, given = parse_run_tail(["--workload", args.workload, "--ds-config", "-", *own], list(tail))
    except UserError as e:
        raise UserError(f"run arguments ({' '.join([*own, *tail])}): {e}") from None
    for name, flag in {**OWNED, **axis_flags(), **({"seq_len": "--seq-len"} if seq_lens else {})}.items():
        if name in given:
            raise UserError(f"run argument {flag} after '--': the sweep sets it per point; "
                            f"use the sweep's own {flag} (or the axis option)")
    return tuple([*own, *tail])


def seq_arg(run_args) -> str | None:
    """The value of ``--seq-len`` among run arguments (the last one given, as argparse reads them), or None."""
    value = None
    for i, a in enumerate(run_args):
        if a == "--seq-len" and i + 1 < len(run_args):
            value = run_args[i + 1]
        elif a.startswith("--seq-len="):
            value = a.split("=", 1)[1]
    return value


def without_seq(run_args) -> tuple[str, ...]:
    out, skip = [], False
    for a in run_args:
        if not skip and a == "--seq-len":
            skip = True
            continue
        if not skip and not a.startswith("--seq-len="):
            out.append(a)
        skip = False
    return tuple(out)
