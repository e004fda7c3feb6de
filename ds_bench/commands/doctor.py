"""``ds-bench doctor``: per-rank network, device and version report and an all_reduce check
(``ds_bench.comm.doctor``). Run it under the launcher the benchmark uses::

    mpirun -np 16 --hostfile hosts .venv/bin/ds-bench doctor --iface ib0 --json results/doctor.jsonl
"""

from __future__ import annotations

import argparse

from ds_bench.config.run_flags import add_local_rank, add_rendezvous_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_rendezvous_arguments(p, dist_timeout_s=60.0)
    p.add_argument("--json", default=None, help="append the full report as a JSON line here")
    p.add_argument("--no-roofline", dest="roofline", action="store_false",
                   help="skip the short matmul/copy ceiling check on every rank")
    add_local_rank(p)


def main(args: argparse.Namespace) -> int:
    from ds_bench.comm.doctor import main as run_doctor

    return run_doctor(args)
