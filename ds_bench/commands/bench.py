"""``ds-bench bench``: this machine's preset sweep (``ds-bench sweep`` with no ``--workload``; what
``make bench`` runs). The same flags and implementation as ``sweep`` (``ds_bench.sweep``)."""

from __future__ import annotations

import argparse

from ds_bench.sweep.spec import add_arguments

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    from ds_bench.sweep.main import main as run_sweep

    return run_sweep(args)
