"""``ds-bench launch LAUNCHER [options] -- COMMAND``: print the mpirun / deepspeed / torchrun / srun command
that runs a ds-bench command on every rank, and run it (``--dry-run``: print only). The builders and the one
place a launcher is started are ``ds_bench.jobs.launch``'s; so are the flags::

    ds-bench launch mpirun --hostfile hosts --iface ib0 -- run --workload gpt2 --ds-config ds_configs/zero2.json
"""

from __future__ import annotations

import argparse
import shlex
import sys

from ds_bench.jobs import launch
from ds_bench.jobs.launch import add_arguments

__all__ = ["add_arguments", "main"]


def main(args: argparse.Namespace) -> int:
    argv = launch.build(launch.LaunchSpec.from_args(args))
    print(shlex.join(argv), flush=True)
    if args.dry_run:
        return 0
    code = launch.run_child(argv)
    if code != 0:
        print(f"ds-bench launch: {argv[0]} exited with code {code}", file=sys.stderr, flush=True)
    return code
