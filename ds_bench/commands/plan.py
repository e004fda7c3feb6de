"""``ds-bench plan``: the best layouts for a model on a cluster, predicted from the device's datasheet or this
cluster's own records, every dropped layout with why; ``--confirm K`` runs the K best (``ds_bench.plan``)::

    ds-bench plan --workload llama --size llama3.1-70b --seq-len 8192 --global-batch 4M --device H100 \\
        --nodes 64 --gpus-per-node 8
    ds-bench plan --workload gpt2 --size tiny --device cpu --calibrate results/roofline.jsonl \\
        --calibrate results/comm.jsonl --confirm 3
"""

from __future__ import annotations

import argparse

from ds_bench.plan.spec import add_arguments

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    from ds_bench.plan.main import main as run_plan

    return run_plan(args)
