"""``ds-bench plan``: the model's shape, the cluster (datasheet or ``--calibrate`` records), the search
(``perf.space``), then the table, the recommended layout's DeepSpeed config, ``--confirm``'s runs and one ``plan``
record. Bad input (``plan.spec``; a batch no layout divides; a model no layout fits) stops before anything is
written, exit 2."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os

from ds_bench.errors import UserError
from ds_bench.perf import calibrate, shapes
from ds_bench.perf.datasheet import cluster_of
from ds_bench.perf.devices import Cluster, cpu_cluster
from ds_bench.perf.space import Dropped, Planned, Space, search, usable_bytes
from ds_bench.plan.confirm import shape_args
from ds_bench.plan.spec import PlanSpec, spec_from_args
from ds_bench.record import store
from ds_bench.record.plan_schema import DroppedGroup, PlanRecord, PlanRow
from ds_bench.report import plan_table

EXAMPLES = 3
GiB = 1024 ** 3


def main(args: argparse.Namespace) -> int:
    from ds_bench.jobs.compute_nodes import for_study

    node = for_study(args)
    if args.device is None:
        print(node.line(), flush=True)
    spec = spec_from_args(args, node)
    shape = shapes.of_workload(spec.workload, spec.size, spec.shape_flags["layers"], spec.shape_flags["hidden"],
                               spec.shape_flags["heads"], spec.seq_len, spec.shape_flags["experts"],
                               spec.shape_flags["top_k"])
    from ds_bench.workloads import REGISTRY

    experts = [v for v in spec.degrees.get("expert_parallel", ()) if v > 1]
    if experts:  # a dense model: named before the search, where every candidate would drop for other rules
        REGISTRY[spec.workload].check_degrees({"expert_parallel": max(experts)})
    cluster = cluster_for(spec)

    shape = dataclasses.replace(shape, norm_kernel=spec.norm)
    if spec.dropout is not None:
        shape = dataclasses.replace(shape, dropout=spec.dropout)
    space = Space(spec.precision, spec.engines, spec.stages, spec.offloads, spec.micro_batches, spec.checkpointing,
                  spec.checkpoint_offload, spec.selective, spec.switches, spec.loss,
                  {k: v for k, v in spec.degrees.items() if v},
                  spec.headroom_pct, spec.attn, eager=spec.attn == "eager")
    if spec.confirm and not spec.dry_run:
        from ds_bench.jobs.runner import check_cluster

        check_cluster(spec)  # under --executor slurm: the controller answers and has --partition
    if spec.sequences < 1:
        raise UserError(f"--global-batch {spec.global_batch_tokens} tokens is less than one --seq-len {spec.seq_len} "
                        "sequence")
    from ds_bench.config.legality import run_options
    from ds_bench.config.study_flags import run_flags_of

    options = run_options(run_flags_of(spec.workload, spec.run_args))
    scaled = None
    if spec.scale:
        from ds_bench.plan import scale

        found, dropped = scale.answers(spec, shape, cluster, space, REGISTRY[spec.workload], options)
        ranked, scaled = [a.planned for a in found], [scale.scaled_to(a) for a in found]
    else:
        ranked, dropped = search(shape, cluster, space, spec.seq_len, spec.sequences, REGISTRY[spec.workload],
                                 options)
    if not ranked:
        raise UserError(nothing_left(shape, spec, cluster, space, dropped))
    record = plan_record(spec, shape, cluster, ranked, dropped, scaled)
    print(plan_table.render(record))
    for line in off_world(spec, cluster.world):
        print(f"skipped: {line}; no candidate has it")
    if spec.show_dropped:
        print("\n".join(f"dropped {d.label}: {d.why}" for d in dropped))
    if spec.dry_run:
        return 0
    record.recommended_config = write_config(spec, ranked[0])
    model = shape_args(spec, record.ranked[0].scaled)
    how = (f"run it with ds-bench run --workload {spec.workload} --ds-config {record.recommended_config} "
           + " ".join([*model, *ranked[0].candidate.run_flags()]) if model is not None else
           f"its model is a larger member of --size {spec.size}, which ds-bench run does not build")
    print(f"recommended layout's DeepSpeed config: {record.recommended_config}; {how}")
    status = 0
    if spec.confirm:
        from ds_bench.plan.confirm import confirm

        status = confirm(spec, record, ranked)
        print(plan_table.confirmed(record))
    store.append_record(spec.results, record)
    print(f"plan record appended to {spec.results}")
    return status


def cluster_for(spec: PlanSpec) -> Cluster:
    """The datasheet's cluster (or CPU ranks') with every figure ``--calibrate``'s records measured in its place;
    ``--achieved`` last."""
    figures = (calibrate.read(list(spec.calibrate), spec.precision, spec.per_node) if spec.calibrate
               else calibrate.Figures())
    if spec.device.lower() == "cpu":
        import psutil

        memory = spec.device_memory or spec.cpu_mem_limit or psutil.virtual_memory().total // spec.per_node
        cluster = cpu_cluster(spec.nodes, spec.per_node, memory, spec.peak_tflops or figures.peak_tflops,
                              figures.intra, figures.hbm_GBps, figures.reserve_bytes, spec.achieved)
    else:
        memory = spec.device_memory or _local_memory(spec)
        cluster = cluster_of(spec.device, spec.nodes, spec.per_node, spec.precision, peak=spec.peak_tflops,
                             memory_bytes=memory, nvlink_domain=spec.nvlink_domain)
    cluster = calibrate.apply(cluster, figures)
    if spec.host_memory and cluster.device_type != "cpu":
        cluster = cluster.with_figures(host_memory_bytes=spec.host_memory,
                                       sources={**cluster.sources, "host_memory": "--host-memory"})
    if spec.peak_tflops:
        cluster = cluster.with_figures(peak_tflops=spec.peak_tflops,
                                       sources={**cluster.sources, "peak_tflops": "--peak-tflops"})
    if spec.achieved:
        cluster = cluster.with_figures(achieved=spec.achieved, sources={**cluster.sources, "achieved": "--achieved"})
    lacking = cluster.missing()
    if lacking:
        raise UserError(f"--device {spec.device}: {lacking} for {cluster.nodes} x {cluster.per_node} ranks; measure it "
                        "(ds-bench comm, then --calibrate its results, or an expectations file with comm busbw bounds)")
    return cluster


def _local_memory(spec: PlanSpec) -> int | None:
    """This machine's GPU memory when the plan is for its own device (no ``--device``)."""
    import torch

    if torch.cuda.is_available() and spec.device == torch.cuda.get_device_name(0):
        return int(torch.cuda.get_device_properties(0).total_memory)
    return None


def nothing_left(shape, spec: PlanSpec, cluster: Cluster, space: Space, dropped: list[Dropped]) -> str:
    """The one line said when no candidate is left: the batch divides no layout, or none fits (the least memory
    any would need)."""
    rules = collections.Counter(d.rule for d in dropped)
    where = f"{cluster.nodes} x {cluster.per_node} {cluster.device}"
    if rules.get("memory"):
        closest = min((d for d in dropped if d.rule == "memory"), key=lambda d: d.excess_bytes)
        usable = usable_bytes(cluster, space)
        return (f"{shape.label} ({shape.params / 1e9:.3g}B parameters) fits no layout on {where} "
                f"({usable / GiB:.1f} GiB usable per device): the least any layout needs is "
                f"{(usable + closest.excess_bytes) / GiB:.1f} GiB per device ({closest.label}); more devices, "
                "offload or a shorter --seq-len")
    if rules.get("host memory"):
        closest = min((d for d in dropped if d.rule == "host memory"), key=lambda d: d.excess_bytes)
        return (f"{shape.label} ({shape.params / 1e9:.3g}B parameters) fits no layout on {where}: the offloading ones "
                f"overflow a node's host memory ({closest.label}: {closest.why}); --host-memory, more nodes or "
                "less offload")
    if rules.get("batch"):
        micro = min(spec.micro_batches or (1,))
        return (f"--global-batch {spec.global_batch_tokens} tokens ({spec.sequences} sequences of {spec.seq_len}) "
                f"divides into no layout's replicas x micro-batch on {where}: give a multiple of the data-parallel "
                f"degrees x micro-batch, e.g. {cluster.world * micro * spec.seq_len} tokens")
    if not dropped:  # no candidate had degrees that fit the world
        return (f"no candidate layout is left on {where}: " + ("; ".join(off_world(spec, cluster.world)) or
                f"no product of the parallel degrees asked divides the world size {cluster.world}"))
    reasons = "; ".join(f"{rule} ({n})" for rule, n in rules.most_common(3))
    return f"no candidate layout is left on {where}: {reasons} (--show-dropped says each)"


def off_world(spec: PlanSpec, world: int) -> list[str]:
    """Each parallel degree asked (``--sequence-parallel 3``) that does not divide the world, in the legality table's
    words for a layout with that degree alone: no candidate has it (``perf.space.candidates``)."""
    from ds_bench.config import legality
    from ds_bench.config.layout import DEGREES, Layout

    where = legality.Where(world_size=world)
    return [legality.violation(Layout(stage=1, offload="none", precision=spec.precision, micro_batch=1,
                                      **{d.field: v}), where)
            for d in DEGREES for v in (spec.degrees.get(d.field) or ()) if world % v]


def plan_record(spec: PlanSpec, shape, cluster: Cluster, ranked: list[Planned], dropped: list[Dropped],
                scaled: list | None = None) -> PlanRecord:
    """The ``plan`` record; ``scaled``: with ``--scale``, each ranked row's member (``PlanRow.scaled``)."""
    base = store.base_record(store.new_run_id(), {"argv": "plan", **{k: str(v) for k, v in vars(spec).items()}})
    rows = [row(i + 1, p, cluster.world) for i, p in enumerate(ranked[:spec.top])]
    for r, s in zip(rows, scaled or []):
        r.scaled = s
    return PlanRecord(kind="plan", status="ok", workload=spec.workload, size=shape.label, params=shape.params,
                      seq_len=spec.seq_len, global_batch_tokens=spec.global_batch_tokens, sequences=spec.sequences,
                      precision=spec.precision, cluster=cluster.to_dict(), candidates=len(ranked) + len(dropped),
                      feasible=len(ranked), ranked=rows, dropped=groups(dropped), scale=spec.scale,
                      **{k: v for k, v in base.items() if k in PlanRecord.model_fields})


def row(rank: int, p: Planned, world: int) -> PlanRow:
    st, mem = p.step, p.memory
    return PlanRow(rank=rank, label=p.candidate.label(world), point=p.candidate.layout.to_dict(),
                   checkpointing=p.candidate.checkpointing, checkpoint_offload=p.candidate.checkpoint_offload,
                   selective_checkpointing=p.candidate.selective,
                   tokens_per_s_per_rank=p.tokens_per_s_per_rank, mfu=p.mfu,
                   step_s=st.total_s, compute_s=st.compute_s, bubble_s=st.bubble_s, optimizer_s=st.optimizer_s,
                   exposed_s=st.exposed_s, comm_s=st.comm_s, busbw_GBps=st.busbw_GBps, memory_bytes=mem.total,
                   states_bytes=mem.states, activations_bytes=mem.activations, logits_bytes=mem.logits,
                   reserve_bytes=mem.reserve)


def groups(dropped: list[Dropped]) -> list[DroppedGroup]:
    by_rule: dict[str, list[Dropped]] = collections.defaultdict(list)
    for d in dropped:
        by_rule[d.rule].append(d)
    out = []
    for rule, items in sorted(by_rule.items(), key=lambda kv: -len(kv[1])):
        shown = sorted(items, key=lambda d: d.excess_bytes)[:EXAMPLES] if "memory" in rule else items[:EXAMPLES]
        out.append(DroppedGroup(rule=rule, count=len(items), examples=[f"{d.label}: {d.why}" for d in shown]))
    return out


def write_config(spec: PlanSpec, best: Planned) -> str:
    """The best layout's DeepSpeed config, derived from ``--ds-config`` (``config.deepspeed.derive``) with the batch
    resolved for the plan's world, portable (as the sweep writes its recommendation), beside the results."""
    from ds_bench.config.deepspeed.derive import derive
    from ds_bench.config.deepspeed.prepare import load_json, portable, write_config as write

    layout = best.candidate.layout
    cfg = derive(load_json(spec.ds_config), layout)
    path = os.path.splitext(spec.results)[0] + ".best.json"
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write(path, portable(cfg))
    return path
