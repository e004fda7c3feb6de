"""``ds-bench capacity``: the largest model of a family, or with ``--scale seq`` the longest sequence, that trains
on these ranks, per layout (``ds_bench.capacity``; flags in ``ds_bench.capacity.spec``)::

    ds-bench capacity --family gpt3 --ds-config ds_configs/zero3.json --stages 2,3 --offload none,optimizer
    ds-bench capacity --scale seq --workload llama --size llama3.2-1b --ds-config ds_configs/zero3.json \\
        --sequence-parallel 1,8 --tiled-mlp off,on --tiled-loss on --seq-len 16384
"""

from __future__ import annotations

import argparse

from ds_bench.capacity.spec import add_arguments

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    from ds_bench.capacity.main import main as run_capacity

    return run_capacity(args)
