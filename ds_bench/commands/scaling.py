"""``ds-bench scaling``: one config at 1, 2, 4, ... ranks (or nodes), per-device throughput and
weak-scaling efficiency (``ds_bench.scaling``; flags in ``ds_bench.scaling.spec``)::

    ds-bench scaling --workload mnist --ds-config ds_configs/zero1.json --ranks 1,2,4 -- --steps 30
"""

from __future__ import annotations

import argparse

from ds_bench.scaling.spec import add_arguments

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    from ds_bench.scaling.main import main as run_scaling

    return run_scaling(args)
