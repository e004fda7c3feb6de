"""``ds-bench doctor``: what every rank sees, and whether the ranks can work together.

Run it under the same launcher as the benchmark (``mpirun ... ds-bench doctor``, ``srun``,
``torchrun``, ``deepspeed --module ds_bench doctor``). Each rank reports its host, interfaces and
addresses, chosen interface and MASTER_ADDR, NCCL_/GLOO_/CUDA_ variables, devices and versions;
rank 0 prints them and checks that versions agree and that an all_reduce gives the right sum;
with several hosts, a checked 64 MiB all_reduce inside each host and one across hosts (one rank
per host) give each link class its own busbw.
The bandwidth figure is the NCCL-tests convention (busbw = 2(n-1)/n x bytes / time, see
NVIDIA/nccl-tests doc/PERFORMANCE.md). Each rank also measures its device's ceiling, briefly
(``ds_bench.measure.ceilings``: one matmul size per dtype and a copy; ``ds-bench roofline`` for the full
record runs read). Exit 0 when all is well, 1 with the reasons when not.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import socket

import torch
from tabulate import tabulate

from ds_bench.cluster import join, process_group
from ds_bench.cluster.netif import read_interfaces
from ds_bench.config import argcheck
from ds_bench.machine import shm
from ds_bench.record import store as results
from ds_bench.record.schema import DoctorRecord

ENV_PREFIXES = ("NCCL_", "GLOO_", "CUDA_", "MASTER_", "OMP_NUM_THREADS", "DS_BENCH_")
ALLREDUCE_BYTES = 8 * 2**20
ALLREDUCE_ITERS = 5
LINK_BYTES = 64 * 2**20
ROOFLINE = {"cuda": (("bf16", "fp16", "fp32"), (8192,), 2**30), "cpu": (("bf16", "fp32"), (512,), 64 * 2**20)}
"""Device type -> (dtypes, matmul sizes, copy bytes) of doctor's short ceiling check."""
ROOFLINE_TIME_S, ROOFLINE_REPEATS = 0.3, 3


def rank_facts(state: process_group.DistState) -> dict:
    ifaces = [f"{i.name} [{i.kind}{'' if i.up else ', down'}] {' '.join(i.addrs) or '-'}" for i in read_interfaces()]
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    stale = shm.leftovers()
    return {"rank": state.rank, "local_rank": state.local_rank, "host": socket.gethostname(),
            "launcher": state.launcher, "rendezvous": state.rendezvous, "interfaces": ifaces, "env": env,
            "devices": devices or [results.hardware(state.device)["device"]], "device": str(state.device),
            "versions": results.versions(), "shm_leftovers": [len(stale), sum(s.size_bytes for s in stale)]}


def version_problems(facts: list[dict]) -> list[str]:
    """Ranks whose package versions differ from rank 0's, one line per package."""
    ref = facts[0]["versions"]
    problems = []
    for package, version in ref.items():
        odd = [f["rank"] for f in facts if f["versions"].get(package) != version]
        if odd:
            seen = {f["rank"]: f["versions"].get(package) for f in facts}
            problems.append(f"{package} differs across ranks: {seen}")
    return problems


def checked_allreduce(state: process_group.DistState, size_bytes: int,
                      groups: list[tuple[tuple[int, ...], object | None]]) -> list[dict]:
    """One checked, timed float32 all_reduce of ``size_bytes`` in each (ranks, process group) of
    ``groups`` (None: the world), through ``comm.timing.sample`` (known-result check, warm-up,
    barrier, device-synchronized clock); returns one ``comm.table`` row per group, time averaged
    over its ranks, with busbw and the ranks' wrong results."""
    from ds_bench.comm import table
    from ds_bench.comm.timing import sample

    mine = [dataclasses.asdict(sample("all_reduce", size_bytes, torch.float32, state.device, ranks.index(state.rank),
                                      len(ranks), 1, ALLREDUCE_ITERS, handle))
            if state.rank in ranks else None for ranks, handle in groups]
    everyone = process_group.gather(mine)
    return [table.rows([[everyone[r][i]] for r in ranks], len(ranks))[0] for i, (ranks, _) in enumerate(groups)]


def allreduce_check(state: process_group.DistState) -> tuple[list[str], dict]:
    """An ``ALLREDUCE_BYTES`` all_reduce over all ranks: right on every rank, and how fast."""
    (row,) = checked_allreduce(state, ALLREDUCE_BYTES, [(tuple(range(state.world_size)), None)])
    if row["wrong"]:
        return row["wrong"], {}
    busbw = row["busbw_GBps"] if state.world_size > 1 else None
    return [], {"allreduce_bytes": row["size_bytes"], "allreduce_ms": row["time_us"] / 1e3, "busbw_GBps": busbw}


def ceiling_check(state: process_group.DistState) -> list[dict]:
    """Every rank's short roofline (all ranks at once), gathered: rows of ``measure.ceilings.measure_rank``."""
    from deepspeed.accelerator import get_accelerator

    from ds_bench.measure import ceilings

    dtypes, sizes, copy_bytes = ROOFLINE["cuda" if state.device.type == "cuda" else "cpu"]
    where = {"rank": state.rank, "host": socket.gethostname(), "device": results.hardware(state.device)["device"]}
    mine = ceilings.measure_rank(where, state.device, dtypes, sizes, copy_bytes, ROOFLINE_TIME_S, ROOFLINE_REPEATS,
                                 get_accelerator().synchronize, torch.distributed.barrier)
    return [row for rows in process_group.gather(mine) for row in rows]


def ceiling_lines(rows: list[dict]) -> list[str]:
    """One line per rank: its matmul TFLOP/s per dtype and its copy GB/s (medians)."""
    out = []
    for rank in sorted({r["rank"] for r in rows}):
        mine = [r for r in rows if r["rank"] == rank]
        parts = [f"matmul {r['dtype']} n={r['size']} {r['median']:.4g} TFLOP/s" if r["test"] == "matmul"
                 else f"copy {r['median']:.4g} GB/s" for r in mine]
        out.append(f"ceiling rank {rank} ({mine[0]['device']}): " + ", ".join(parts))
    return out


def link_check(state: process_group.DistState, hosts: list[str]) -> list[dict]:
    """With several hosts, one checked ``LINK_BYTES`` all_reduce inside each host and one across hosts
    (``ds_bench.comm.topology``), so a slow or broken link class shows apart from the others."""
    from ds_bench.comm.topology import link_groups, make_groups

    groups = make_groups(link_groups(hosts), state.rank)
    rows = checked_allreduce(state, LINK_BYTES, [(group.ranks, handle) for group, handle in groups])
    return [{"link": f"{group.scope} ({group.label})", **row} for (group, _), row in zip(groups, rows)]


def link_lines(links: list[dict]) -> tuple[list[str], list[str]]:
    """(report lines, problems) of ``link_check`` rows."""
    lines = [f"link {row['link']}: all_reduce {row['size_bytes'] // 2**20} MiB busbw {row['busbw_GBps']:.3g} GB/s"
             for row in links]
    return lines, [w for row in links for w in row["wrong"]]


def report(facts: list[dict], problems: list[str], timing: dict, links: list[str] = ()) -> str:
    rows = [[f["rank"], f["host"], f["local_rank"], f["device"], f"{f['rendezvous']['iface']} "
             f"({f['rendezvous']['iface_addr']})", f"{f['rendezvous']['master_addr']}:{f['rendezvous']['master_port']}",
             "\n".join(f["interfaces"])] for f in facts]
    out = [tabulate(rows, headers=["rank", "host", "local", "device", "chosen iface", "master", "interfaces"],
                    tablefmt="grid"),
           f"launcher: {facts[0]['launcher']}; interface choice on rank 0: {facts[0]['rendezvous']['reason']}",
           "environment (rank 0): " + (", ".join(f"{k}={v}" for k, v in facts[0]["env"].items()) or "-"),
           "versions (rank 0): " + ", ".join(f"{k} {v}" for k, v in facts[0]["versions"].items() if v)]
    if timing:
        bw = f", busbw {timing['busbw_GBps']:.2f} GB/s" if timing.get("busbw_GBps") else ""
        out.append(f"all_reduce: correct; {timing['allreduce_bytes'] // 2**20} MiB in "
                   f"{timing['allreduce_ms']:.2f} ms{bw}")
    out += list(links)
    out += leftover_notes(facts)
    out += [f"PROBLEM: {p}" for p in problems] or ["OK: ranks agree on versions and all_reduce works"]
    return "\n".join(out)


def leftover_notes(facts: list[dict]) -> list[str]:
    """One line per host holding DeepSpeed shm buffers that no process maps (RAM lost until removed)."""
    seen: dict[str, list[int]] = {}
    for f in facts:
        count, size = f.get("shm_leftovers", [0, 0])
        if count:
            seen[f["host"]] = [count, size]
    return [f"NOTE: {host}: {count} leftover DeepSpeed shm buffer(s) hold {size / 2**30:.2f} GiB of RAM in "
            f"{shm.SHM_DIR} (stock DeepSpeed never unlinks them); `python -m ds_bench.machine.op_builds` removes them"
            for host, (count, size) in seen.items()]


def main(args: argparse.Namespace) -> int:
    argcheck.output_folder("--json", args.json)
    return run_doctor(args.iface, args.dist_timeout_s, args.connect_timeout_s, args.json, args.roofline)


def run_doctor(iface: str | None, dist_timeout_s: float, connect_timeout_s: float, json_path: str | None,
               with_ceiling: bool = True) -> int:
    state = join.join(join.find_rendezvous(iface, dist_timeout_s), dist_timeout_s, connect_timeout_s)
    facts = process_group.gather(rank_facts(state))
    try:
        problems, timing = allreduce_check(state)
    except RuntimeError as e:  # a collective that failed or timed out
        problems, timing = [f"all_reduce failed: {e}"], {}
    links: list[str] = []
    if not problems:
        link_rows = link_check(state, [f["host"] for f in facts])
        links, wrong = link_lines(link_rows)
        problems += wrong
        timing = {**timing, "links": link_rows} if link_rows else timing
    if with_ceiling and not problems:
        ceilings = ceiling_check(state)
        links += ceiling_lines(ceilings)
        timing = {**timing, "roofline": ceilings}
    problems = version_problems(facts) + problems
    verdict = [problems]
    torch.distributed.broadcast_object_list(verdict, src=0)
    if state.rank == 0:
        print(report(facts, problems, timing, links), flush=True)
        if json_path:
            results.append_record(json_path, DoctorRecord(kind="doctor", ranks=facts, problems=problems, **timing))
    return 1 if verdict[0] else 0
