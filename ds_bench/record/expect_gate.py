"""``--expect FILE`` on every command (the flag is defined here, once): the file is checked before the
command starts (a bad one is a one-line error, exit 2, before any process group is joined), and when the
command has ended its measurements are held against it: a table of pass / fail / not measured, and exit 1
on a fail when the command itself succeeded.

What is measured: ``report`` the files it reads, ``compare`` its NEW file, every other command the records
it appended to its results file (``--results``; doctor's ``--json``) during this invocation. A distributed
``run`` checks on rank 0 only, the rank that writes the run's record.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ds_bench.logs import process_rank

if TYPE_CHECKING:
    from ds_bench.record.expect_file import ExpectFile

__all__ = ["Gate", "add_argument", "open_gate"]


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--expect", default=None, metavar="FILE",
                   help="expectations (YAML or JSON, docs/expect.schema.json) the measurements must meet; "
                        "exit 1 when one fails")


@dataclass
class Gate:
    expect: ExpectFile
    path: str
    inputs: list[tuple[str, int]]
    """(results file, byte offset the command's own records start at)."""

    def close(self, code: int) -> int:
        """The command's exit code, made 1 when it was 0 and an expectation failed."""
        if process_rank() != 0:
            return code
        from ds_bench.record import store
        from ds_bench.record.expect_check import evaluate, summary_line, table

        records = [r for path, start in self.inputs for r in store.read_records(path, missing_ok=True, start=start)]
        outcomes = evaluate(self.expect, records)
        print("\n" + table(outcomes))
        print(summary_line(outcomes, self.path), flush=True)
        return 1 if code == 0 and any(o.failed for o in outcomes) else code


def open_gate(args: argparse.Namespace) -> Gate | None:
    """The gate of ``args.expect`` (None without one); the file checked now, and left loaded as
    ``args.expect_file`` for a command that shows the outcomes itself (report, compare pages)."""
    path = getattr(args, "expect", None)
    if not path:
        return None
    from ds_bench.record.expect_file import load  # the router stays light for the commands given no file

    args.expect_file = load(path)
    return Gate(args.expect_file, path, inputs(args))


def inputs(args: argparse.Namespace) -> list[tuple[str, int]]:
    """Where a command's measurements are: whole files it reads, or what it appends from now on."""
    if args.command == "report":
        return [(path, 0) for path in args.results]
    if args.command == "compare":
        return [(args.new, 0)]
    path = args.json if args.command == "doctor" else getattr(args, "results", None)
    if not path:
        return []
    return [(path, os.path.getsize(path) if os.path.isfile(path) else 0)]
