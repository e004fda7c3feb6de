"""``ds-bench run``: one benchmark run as every rank executes it (``ds_bench.run.main``).

Its flags are ``RunConfig``'s fields (``ds_bench.config.run_flags``)::

    torchrun --nproc_per_node 2 -m ds_bench run --workload gpt2 --ds-config ds_configs/zero2.json --steps 20
"""

from __future__ import annotations

import argparse

from ds_bench.config.run_flags import add_run_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)


def main(args: argparse.Namespace) -> int:
    from ds_bench.config.run_flags import run_config
    from ds_bench.run.main import run_benchmark

    return run_benchmark(run_config(args))
