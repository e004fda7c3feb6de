"""``ds-bench comm``: set up (flags, rendezvous, process group), execute (every collective at every
size, checked and timed), record (rank 0: one ``kind: comm`` record, the table, the plot, the gate).

Run it under the launcher the training uses, e.g.::

    torchrun --nproc_per_node 8 -m ds_bench comm --max-bytes 1GiB --expect-busbw 150
    mpirun -np 16 --hostfile hosts .venv/bin/ds-bench comm --iface ib0
    srun --mpi=pmix .venv/bin/ds-bench comm --collectives all_reduce,all_gather

Exit 0 when every result is right and every ``--expect-busbw`` is met; 1 with the reasons otherwise.
"""

from __future__ import annotations

import dataclasses
import logging
import os

import torch

from ds_bench.cluster import join, process_group
from ds_bench.comm import pairs, table
from ds_bench.comm.bandwidth import sizes
from ds_bench.comm.spec import MAX_BYTES, CommSpec, from_args
from ds_bench.comm.timing import sample
from ds_bench.comm.topology import link_groups, make_groups
from ds_bench.record import store as results
from ds_bench.record.schema import CommRecord

log = logging.getLogger("ds_bench")
MAX_PRINTED = 12
ONE_RANK_NOTE = ("1 rank: no data crosses a link, so busbw is 0 or meaningless by definition and algbw times a "
                 "local copy (or nothing, for in-place all_reduce); the results check still runs")
LARGE_SIZES = 3
"""How many of the largest sizes are repeated inside each host and across hosts."""
ENV_PREFIXES = ("NCCL_", "GLOO_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "DS_BENCH_")


def main(args) -> int:
    spec = from_args(args)
    state = _join(spec)
    hosts = process_group.gather(os.uname().nodename)
    collectives = [c for c in spec.collectives if not (c == "send_recv" and state.world_size == 1)]
    message_sizes = sizes(spec.min_bytes, spec.max_bytes or MAX_BYTES[state.device.type], spec.step_factor)
    rows, error = [], None
    try:
        rows = _world_rows(spec, state, collectives, message_sizes)
        rows += _link_rows(spec, state, hosts, collectives, message_sizes[-LARGE_SIZES:])
        if spec.pairs:
            rows += pairs.rows(process_group.gather(pairs.rank_samples(hosts, state.rank, message_sizes[-LARGE_SIZES:],
                                                                 getattr(torch, spec.dtype), state.device, spec.warmup,
                                                                 spec.iters)))
    except RuntimeError as e:  # a collective that failed or timed out: a result, not a traceback
        error = f"{type(e).__name__}: {e}"
    problems = _record(spec, state, rows, hosts, error) if state.rank == 0 else []
    verdict = [problems]
    if error is None:
        torch.distributed.broadcast_object_list(verdict, src=0)
    return 1 if verdict[0] or error else 0


def _samples(spec: CommSpec, state: process_group.DistState, collectives: list[str], message_sizes: list[int],
             rank: int, n: int, group=None) -> list[dict]:
    return [dataclasses.asdict(sample(collective, size, getattr(torch, spec.dtype), state.device, rank, n, spec.warmup,
                                      spec.iters, group)) for collective in collectives for size in message_sizes]


def _world_rows(spec, state, collectives, message_sizes) -> list[dict]:
    """Every collective at every size over all ranks; one gather per collective, after its sizes."""
    per_rank: list[list[dict]] = [[] for _ in range(state.world_size)]
    for collective in collectives:
        mine = _samples(spec, state, [collective], message_sizes, state.rank, state.world_size)
        for rank, samples in enumerate(process_group.gather(mine)):
            per_rank[rank] += samples
        if state.rank == 0:
            log.info("%s: %d sizes done", collective, len(message_sizes))
    return [{"scope": "world", "group": "all ranks", **row} for row in table.rows(per_rank, state.world_size)]


def _link_rows(spec, state, hosts, collectives, large) -> list[dict]:
    """With several hosts: the largest sizes again inside each host and across hosts (``topology``)."""
    mine: list[list[dict]] = []
    groups = make_groups(link_groups(hosts), state.rank)
    for group, handle in groups:
        n = len(group.ranks)
        ring = [c for c in collectives if not (c == "send_recv" and n == 1)]
        mine.append(_samples(spec, state, ring, large, group.ranks.index(state.rank), n, handle)
                    if handle is not None else [])
    everyone = process_group.gather(mine)
    out = []
    for i, (group, _) in enumerate(groups):
        per_rank = [everyone[r][i] for r in group.ranks]
        out += [{"scope": group.scope, "group": group.label, **row} for row in table.rows(per_rank, len(group.ranks))]
    return out


def _join(spec: CommSpec) -> process_group.DistState:
    return join.join(join.find_rendezvous(spec.iface, spec.dist_timeout_s), spec.dist_timeout_s, spec.connect_timeout_s)


def _record(spec: CommSpec, state: process_group.DistState, rows: list[dict], hosts: list[str],
            error: str | None) -> list[str]:
    """Rank 0: print the table, append the record, write the plot; returns the problems."""
    problems = ([error] if error else []) + table.wrong_results(rows) + table.gate(rows, spec.expect_busbw)
    record = CommRecord(**results.base_record(results.new_run_id(), spec.to_dict()), kind="comm",
                        status="failed" if problems else "ok", problems=problems, world_size=state.world_size,
                        hosts=hosts, launcher=state.launcher, backend=state.backend,
                        rendezvous=state.rendezvous, hardware=results.hardware(state.device),
                        env={k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
                        dtype=spec.dtype, warmup=spec.warmup, iters=spec.iters, results=rows)
    link_lines = _pairs_verdict(spec, rows, record) if spec.pairs else []
    if state.world_size == 1:
        record.note = ONE_RANK_NOTE
        print(f"NOTE: {ONE_RANK_NOTE}", flush=True)
    results.append_record(spec.results, record)
    if rows:
        print(table.table(rows), flush=True)
        title = f"{state.world_size} ranks, {state.backend}, {record.hardware['device']}, {spec.dtype}"
        print(f"plot:    {table.write_plot(rows, spec.plot, title)}", flush=True)
    for line in link_lines:
        print(line, flush=True)
    print(f"results: {spec.results} (run {record.run_id})", flush=True)
    for line in problems[:MAX_PRINTED]:
        print(f"PROBLEM: {line}", flush=True)
    if len(problems) > MAX_PRINTED:
        print(f"PROBLEM: ... and {len(problems) - MAX_PRINTED} more (all in the record's 'problems')", flush=True)
    return problems


def _pairs_verdict(spec: CommSpec, rows: list[dict], record: CommRecord) -> list[str]:
    """``slow_links`` and ``suspect_hosts`` into the record; the lines to print."""
    pair_rows = [r for r in rows if r["scope"] == "pair"]
    slow = pairs.slow_links(pair_rows, spec.slow_link_threshold)
    record.slow_links, record.suspect_hosts = slow, pairs.suspect_hosts(pair_rows, slow)
    return pairs.describe(pair_rows, slow, record.suspect_hosts, spec.slow_link_threshold)
