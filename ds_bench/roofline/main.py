"""``ds-bench roofline``: achieved dense matmul TFLOP/s per dtype and copy bandwidth on every device of the
job, as one ``kind: roofline`` record (``ds_bench.measure.ceilings`` says how each figure is taken).

Run it under the launcher the benchmarks use (or alone, one process): every rank measures its own device
at the same time as the others, rank 0 prints the table and appends the record. Runs whose results file
sits in the same folder then report ``mfu_vs_measured`` against the newest record of their host.
"""

from __future__ import annotations

import argparse
import socket

import torch
from tabulate import tabulate

from ds_bench.cluster import join, process_group
from ds_bench.config import argcheck
from ds_bench.config.parsers import flag_type, parse_bytes, parse_count, parse_list
from ds_bench.config.preflight import check_results_path
from ds_bench.errors import UserError
from ds_bench.measure import ceilings
from ds_bench.record import store as results
from ds_bench.record.schema import RooflineRecord, RooflineRow

DEFAULT_SIZES = {"cuda": "4096,8192", "cpu": "512,1024"}
DEFAULT_COPY = {"cuda": "1GiB", "cpu": "64MiB"}


def main(args: argparse.Namespace) -> int:
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    dtypes = parse_list("--dtypes", args.dtypes or ("bf16,fp32,fp16" if device_type == "cuda" else "bf16,fp32"),
                        tuple(ceilings.DTYPES))
    sizes = parse_list("--sizes", args.sizes or DEFAULT_SIZES[device_type], kind=flag_type(parse_count, "--sizes"))
    copy_bytes = parse_bytes("--copy-bytes", args.copy_bytes or DEFAULT_COPY[device_type])
    if copy_bytes < 4 or not 0 < args.min_time_s <= 600 or args.repeats < 1:
        raise UserError(f"--copy-bytes must be >= 4, --min-time in (0, 600] s and --repeats >= 1; got "
                        f"{args.copy_bytes}, {args.min_time_s}, {args.repeats}")
    gemm_shapes = run_gemms(args.gpt2, args.tokens)
    check_results_path(args.results)  # a missing folder is created with the record, as run and the studies do
    state = join.join(join.find_rendezvous(args.iface, args.dist_timeout_s), args.dist_timeout_s, args.connect_timeout_s)
    mine = measure(state, dtypes, sizes, copy_bytes, args.min_time_s, args.repeats, gemm_shapes)
    rows = [row for rank_rows in process_group.gather(mine) for row in rank_rows]
    if state.rank == 0:
        print(table(rows), flush=True)
        record = RooflineRecord(kind="roofline", world_size=state.world_size, min_time_s=args.min_time_s,
                                results=rows, **results.base_record(results.new_run_id(), vars(args)))
        results.append_record(args.results, record)
        print(f"results: {args.results}", flush=True)
    return 0


def run_gemms(size: str | None, tokens: int | None) -> tuple:
    """``--gpt2 SIZE --tokens T``: the (name, m, k, n) products to time (``gpt2_shapes.gemms``)."""
    from ds_bench.workloads.gpt2_shapes import SHAPES, gemms

    if size is None:
        if tokens is not None:
            raise UserError("--tokens needs --gpt2 SIZE (whose products it sizes)")
        return ()
    if size not in SHAPES:
        raise UserError(f"--gpt2 {size!r} is unknown; known: {', '.join(SHAPES)}")
    if tokens is not None and tokens < 1:
        raise UserError(f"--tokens must be a positive integer, got {tokens}")
    _, n_embd, _ = SHAPES[size]
    return tuple(gemms(n_embd, tokens or 4096))


def measure(state: process_group.DistState, dtypes: tuple, sizes: tuple, copy_bytes: int, min_time_s: float,
            repeats: int, gemms: tuple = ()) -> list[RooflineRow]:
    """This rank's figures (``measure.ceilings.measure_rank``)."""
    from deepspeed.accelerator import get_accelerator

    where = {"rank": state.rank, "host": socket.gethostname(), "device": results.hardware(state.device)["device"]}
    return [RooflineRow(**row) for row in ceilings.measure_rank(where, state.device, dtypes, sizes, copy_bytes,
                                                                  min_time_s, repeats, get_accelerator().synchronize,
                                                                  torch.distributed.barrier, gemms)]


def table(rows: list[RooflineRow]) -> str:
    body = [[r.rank, r.host, r.device, r.test if r.name is None else f"gemm {r.name}", r.dtype,
             r.size if r.shape is None else " x ".join(map(str, r.shape)), f"{r.median:.4g}",
             f"{r.low:.4g}-{r.high:.4g}", "GB/s" if r.test == "copy" else "TFLOP/s"] for r in rows]
    return tabulate(body, headers=["rank", "host", "device", "test", "dtype", "n / m x k x n / bytes", "median",
                                   "min-max", "unit"])
