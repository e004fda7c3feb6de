"""``ds-bench roofline``: the measured ceiling of every device of the job, dense matmul TFLOP/s per dtype
and copy GB/s, as one ``kind: roofline`` record (``ds_bench.roofline.main``)::

    torchrun --nproc_per_node 8 -m ds_bench roofline --gpt2 gpt3-1.3b --results results/roofline.jsonl
"""

from __future__ import annotations

import argparse

from ds_bench.config.parsers import flag_type, parse_count, parse_duration
from ds_bench.config.run_flags import add_local_rank, add_rendezvous_arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtypes", default=None, help="fp32,bf16,fp16 (default: bf16 and fp32; fp16 too on GPUs)")
    p.add_argument("--sizes", default=None, help="square matmul sides, e.g. 4096,8192 or 4k,8k (k = 2^10; default: "
                                                 "4096,8192 on GPUs, 512,1024 on CPUs)")
    p.add_argument("--gpt2", default=None, metavar="SIZE",
                   help="also time the matrix products of one GPT-2 SIZE block and its LM head (forward and backward) "
                        "at --tokens: a run's own GEMM shapes (e.g. small, gpt3-1.3b)")
    p.add_argument("--tokens", type=flag_type(parse_count, "--tokens"), default=None,
                   help="with --gpt2: micro-batch x sequence length, e.g. 4k (k = 2^10; default 4096)")
    p.add_argument("--copy-bytes", default=None, metavar="SIZE",
                   help="bytes copied per copy operation (default 1GiB GPU, 64MiB CPU)")
    p.add_argument("--min-time", dest="min_time_s", type=flag_type(parse_duration, "--min-time"), default=1.0,
                   metavar="DURATION", help="timed work per figure, e.g. 0.5s (default 1s)")
    p.add_argument("--repeats", type=int, default=5, help="samples per figure (default 5): median, min, max")
    p.add_argument("--results", default="results/roofline.jsonl", help="JSON-lines file the record is appended to")
    add_rendezvous_arguments(p, dist_timeout_s=60.0)
    add_local_rank(p)


def main(args: argparse.Namespace) -> int:
    from ds_bench.roofline.main import main as measure_ceilings

    return measure_ceilings(args)
