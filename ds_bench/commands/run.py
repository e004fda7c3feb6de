"""``ds-bench run``: one benchmark run as every rank executes it (``ds_bench.run.main``); rank 0 prints the
record's summary (``ds_bench.report.summary``).

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
    from ds_bench.report import summary
    from ds_bench.run.main import run_benchmark

    cfg = run_config(args)
    record = run_benchmark(cfg)
    if record is not None:
        print(summary.one_run(record, cfg.results), flush=True)
    return 0
