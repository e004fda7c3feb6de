"""``ds-bench comm`` flags into a checked ``CommSpec``: every bad value is a one-line error (exit 2)
before the process group is joined."""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import asdict, dataclass

from ds_bench.comm.bandwidth import COLLECTIVES
from ds_bench.config import argcheck
from ds_bench.config.parsers import parse_bytes
from ds_bench.config.preflight import check_results_path
from ds_bench.config.run_flags import add_local_rank, add_rendezvous_arguments
from ds_bench.errors import UserError

DTYPES = ("float32", "float16", "bfloat16", "float64")
"""``--dtype`` choices, each the name of its torch dtype (``getattr(torch, name)``); no torch here, so the
command's flags are built without importing it."""
MAX_BYTES = {"cpu": 256 * 2**20, "cuda": 4 * 2**30}
"""Default largest message: 256 MiB on CPU ranks, 4 GiB on GPUs (nccl-tests users go to 8 GiB)."""
DEFAULT_SLOW_LINK_PCT = 25.0
"""``--slow-link-threshold``'s default: a link more than this many percent below the best is slow
(``ds_bench.comm.pairs``)."""


@dataclass(frozen=True)
class CommSpec:
    collectives: tuple[str, ...]
    min_bytes: int
    max_bytes: int | None
    """None: the device's default (``MAX_BYTES``), filled in once the device is known."""
    step_factor: int
    dtype: str
    warmup: int
    iters: int
    expect_busbw: dict[str, float]
    """Collective -> the least busbw (GB/s) its largest message must reach."""
    results: str
    plot: str | None
    iface: str | None
    dist_timeout_s: float
    connect_timeout_s: float
    pairs: bool = False
    """Also measure send/recv between every pair of hosts (``ds_bench.comm.pairs``)."""
    slow_link_threshold: float = DEFAULT_SLOW_LINK_PCT

    def to_dict(self) -> dict:
        return asdict(self)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--collectives", default=",".join(COLLECTIVES),
                   help=f"comma list of {', '.join(COLLECTIVES)} (default: all)")
    p.add_argument("--min-bytes", default="8", metavar="SIZE",
                   help="smallest message, e.g. 8 (bytes), 1KiB (default 8 B; KiB = 2^10, KB = 10^3)")
    p.add_argument("--max-bytes", default=None, metavar="SIZE",
                   help="largest message (default 256MiB on CPU, 4GiB on GPU)")
    p.add_argument("--step-factor", type=int, default=2, help="size multiplier between steps (default 2)")
    p.add_argument("--dtype", default="float32", help=", ".join(DTYPES))
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per size (default 5)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size (default 20)")
    p.add_argument("--expect-busbw", action="append", default=[], metavar="[COLLECTIVE=]GBPS",
                   help="exit 1 when the largest message's busbw is below this (bare: all_reduce); repeatable")
    p.add_argument("--pairs", action="store_true",
                   help="also measure send/recv between every pair of hosts and name the slow links")
    p.add_argument("--slow-link-threshold", type=float, default=DEFAULT_SLOW_LINK_PCT, metavar="PCT",
                   help=f"with --pairs: a link more than PCT%% below the best link is slow (default {DEFAULT_SLOW_LINK_PCT:g})")
    p.add_argument("--results", default="results/comm.jsonl", help="JSON-lines record file (appended)")
    p.add_argument("--plot", default=None, help="busbw vs size PNG (default: beside --results)")
    add_rendezvous_arguments(p, dist_timeout_s=300.0)
    add_local_rank(p)


def from_args(args: argparse.Namespace) -> CommSpec:
    collectives = parse_collectives(args.collectives)
    min_bytes = parse_bytes("--min-bytes", args.min_bytes)
    max_bytes = None if args.max_bytes is None else parse_bytes("--max-bytes", args.max_bytes)
    if max_bytes is not None and max_bytes < min_bytes:
        raise UserError(f"--max-bytes ({max_bytes}) must be >= --min-bytes ({min_bytes})")
    argcheck.at_least("--step-factor", args.step_factor, 2)
    if args.dtype not in DTYPES:
        raise UserError(f"--dtype {args.dtype!r}: expected one of {', '.join(DTYPES)}")
    argcheck.at_least("--warmup", args.warmup, 0)
    argcheck.at_least("--iters", args.iters, 1)
    if not (math.isfinite(args.slow_link_threshold) and 0 < args.slow_link_threshold < 100):
        raise UserError(f"--slow-link-threshold {args.slow_link_threshold:g}: expected a percentage between 0 and 100")
    check_results_path(args.results)  # a missing folder is created with the record, as run and the studies do
    argcheck.output_folder("--plot", args.plot)
    plot = args.plot or os.path.splitext(args.results)[0] + "_busbw.png"
    return CommSpec(collectives=collectives, min_bytes=min_bytes, max_bytes=max_bytes,
                    step_factor=args.step_factor, dtype=args.dtype, warmup=args.warmup, iters=args.iters,
                    expect_busbw=parse_expectations(args.expect_busbw, collectives), results=args.results,
                    plot=plot, iface=args.iface, dist_timeout_s=args.dist_timeout_s,
                    connect_timeout_s=args.connect_timeout_s, pairs=args.pairs,
                    slow_link_threshold=args.slow_link_threshold)


def parse_collectives(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    unknown = [t for t in names if t not in COLLECTIVES]
    if unknown or not names:
        raise UserError(f"--collectives {text!r}: expected a comma list of {', '.join(COLLECTIVES)}")
    return names


def parse_expectations(items: list[str], collectives: tuple[str, ...]) -> dict[str, float]:
    """``["25", "all_gather=20"]`` -> ``{"all_reduce": 25.0, "all_gather": 20.0}`` (pure)."""
    out: dict[str, float] = {}
    for item in items:
        name, _, value = item.rpartition("=")
        name = name.strip() or "all_reduce"
        try:
            gbps = float(value)
        except ValueError:
            gbps = math.nan
        if not (math.isfinite(gbps) and gbps > 0):
            raise UserError(f"--expect-busbw {item!r}: expected GBPS or COLLECTIVE=GBPS with GBPS a number > 0")
        if name not in collectives:
            raise UserError(f"--expect-busbw {item!r}: {name} is not among the measured collectives "
                            f"({', '.join(collectives)})")
        out[name] = gbps
    return out
