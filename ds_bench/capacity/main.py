"""``ds-bench capacity``: for each layout asked (ZeRO stage, offload, parallel degrees, memory options, at
micro-batch 1 unless given), the largest model of a family that trains on these ranks (``capacity.driver``),
or with ``--scale seq`` the longest sequence one model trains with (``capacity.seq_driver``), as a
table in the spirit of BigScience's GPT-2 experiments: ranks, layout, the largest size that ran, the
next size and why it failed, time per iteration, tokens/s, TFLOP/s per device, peak memory against
the capacity, predicted/measured memory.

    ds-bench capacity --ds-config zero1.json --stages 0,3 --family gpt3 --micro-batch 1
    ds-bench capacity --ds-config zero1.json --stages 0,3 --offload none,optimizer --scale layers \\
        --layers 2 --hidden 64 --heads 2 --seq-len 64 --cpu-mem-limit 1GiB
    ds-bench capacity --ds-config zero3.json --workload llama --size llama3.2-1b --scale seq \\
        --sequence-parallel 1,8 --tiled-mlp off,on --tiled-loss on --seq-len 16384
    ds-bench capacity --ds-config zero1.json --workload moe --stages 1,2 --expert-parallel 1,2 --scale layers \\
        --layers 1 --hidden 512 --heads 8 --seq-len 64 --cpu-mem-limit 2.5GiB -- --experts 8 --top-k 2

Every probe appends a ``capacity_probe`` record to ``--results`` (the search's state: re-running the
same command goes on from there, and Ctrl-C keeps finished probes); each layout then a ``capacity``
record; ``ds-bench report`` prints their table again. Exit 0 when some layout trained a member.
"""

from __future__ import annotations

import argparse
import dataclasses

from ds_bench.capacity.driver import LayoutSearch
from ds_bench.capacity.seq_driver import SeqSearch
from ds_bench.capacity.spec import CapacitySpec, from_args
from ds_bench.config.layout import Layout
from ds_bench.config.legality import Where
from ds_bench.jobs import ledger, spawn
from ds_bench.perf.grid import skip_reason, study_where
from ds_bench.jobs.runner import (
    INTERRUPTED,
    check_cluster,
    executor_line,
    run_concurrently,
    until_interrupted,
    workers,
)
from ds_bench.jobs.compute_nodes import for_study, rank_capacity
from ds_bench.jobs.stack_axis import prepare_stacks, stack_lines, stack_where
from ds_bench.record import store
from ds_bench.record.schema import CapacityProbeRecord, CapacityRecord
from ds_bench.report import capacity_table


def main(args: argparse.Namespace) -> int:
    node = for_study(args)
    print(node.line(), flush=True)
    spec = from_args(args, node)
    if not args.dry_run:
        check_cluster(spec)  # before the memory per rank is asked of the nodes Slurm describes
    world, per_node = spawn.world_of(spec)
    capacity = rank_capacity(spec, per_node)
    size = "" if spec.scale == "seq" else f", {len(spec.members)} member(s)"
    memory = f"{capacity / 2**30:.2f} GiB" if capacity != float("inf") else "memory not known"
    print(f"capacity {spec.capacity_id()}: {spec.family}{size}, {world} rank(s), {memory} per rank, results "
          f"{spec.results}", flush=True)
    if args.dry_run:
        print(dry_run_text(spec, world))
        return 0
    prepare_stacks(spec)
    done = load_probes(spec.results, spec.capacity_id())
    where = study_where(spec, world)
    searches = [lambda layout=layout: _search(spec, layout, stack_where(spec, where, layout), per_node, capacity, done)
                for layout in spec.layouts]
    finished, summaries = until_interrupted(  # layouts are independent: under Slurm, searched at once
        lambda: run_concurrently(searches, workers(spec, len(searches))),
        lambda: (f"capacity search interrupted: {len(load_probes(spec.results, spec.capacity_id()))} probe(s) "
                 f"recorded in {spec.results}; re-run the same command to go on from there"))
    if not finished:
        return INTERRUPTED
    for record in summaries:
        store.append_record(spec.results, record)
    print("\n" + capacity_table.table(summaries))
    print(f"results: {spec.results} (probes' runs: {spec.runs_path})")
    return 0 if any(r.status == "ok" for r in summaries) else 1


def _search(spec: CapacitySpec, layout: Layout, where: Where, per_node: int, capacity: int,
            done: dict) -> CapacityRecord:
    why = _skip_reason(spec, layout, where)
    search = (SeqSearch if spec.scale == "seq" else LayoutSearch)(spec, layout, where.world_size, per_node, capacity,
                                                                  done)
    if why is not None:
        print(f"{layout.key}: skipped: {why}", flush=True)
        return search.summary_skipped(why)
    return search.summary(search.run())


def load_probes(path: str, capacity_id: str) -> dict[tuple[str, int], CapacityProbeRecord]:
    """The latest probe of each (layout, member) of this search."""
    return ledger.load(path, CapacityProbeRecord, lambda r: r.capacity == capacity_id, lambda r: (r.layout, r.index))


def _skip_reason(spec: CapacitySpec, layout: Layout, where: Where) -> str | None:
    """The legality table's sentence, the layout read with the sequence its probes run (``--scale seq``: the
    start, every length a multiple of the same degrees)."""
    return skip_reason(dataclasses.replace(layout, seq_len=spec.seq_len), where)


def dry_run_text(spec: CapacitySpec, world: int) -> str:
    slurm = executor_line(spec, len(spec.layouts), "probe (layouts at once)")
    return "\n".join([_plan_text(spec, world), slurm] if slurm else [_plan_text(spec, world)])


def _plan_text(spec: CapacitySpec, world: int) -> str:
    lines, where = ["layouts:"], study_where(spec, world)
    for layout in spec.layouts:
        why = _skip_reason(spec, layout, stack_where(spec, where, layout))
        lines.append(f"  {layout.key}" + (f"  skipped: {why}" if why else ""))
    lines += stack_lines(spec.stacks)
    if spec.scale == "seq":
        m, lengths = spec.members[0], spec.lengths
        return "\n".join([*lines, f"sequence lengths of {' '.join(m.run_args)} ({m.params / 1e6:.1f}M parameters"
                                   f"{_experts(m)}): "
                                   f"doubled from {lengths.start} to at most {lengths.top}, then bisected to a "
                                   f"granularity of {lengths.step} (multiples of {lengths.multiple}: every "
                                   "--sequence-parallel degree of a layout not skipped divides them)"])
    lines.append("family, smallest first:")
    lines += [f"  {m.name:<18} {m.params / 1e6:10.1f}M parameters{_experts(m)}  ({' '.join(m.run_args)})"
              for m in spec.members]
    return "\n".join(lines)


def _experts(m) -> str:
    """A moe member's experts' share: what ``--expert-parallel`` shards (``perf.states``)."""
    return f", {m.expert_params / 1e6:.1f}M of them in experts" if m.expert_params else ""
