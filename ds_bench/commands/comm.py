"""``ds-bench comm``: collective bandwidth (nccl-tests busbw) and correctness on the launched ranks
(``ds_bench.comm.main``; flags in ``ds_bench.comm.spec``)::

    torchrun --nproc_per_node 8 -m ds_bench comm --max-bytes 1GiB --expect-busbw 150
"""

from __future__ import annotations

import argparse

from ds_bench.comm.spec import add_arguments

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    from ds_bench.comm.main import main as measure_collectives

    return measure_collectives(args)
