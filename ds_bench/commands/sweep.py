"""``ds-bench sweep``: find the fastest configuration that fits (``ds_bench.sweep``), ranked, with a
recommendation::

    ds-bench sweep --workload gpt2 --ds-config ds_configs/zero2.json --stages 1,2,3 -- --steps 20
"""

from __future__ import annotations

import argparse

from ds_bench.sweep.spec import add_arguments

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    from ds_bench.sweep.main import main as run_sweep

    return run_sweep(args)
