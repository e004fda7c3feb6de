"""``ds-bench plan``'s text: the cluster it modelled, the ranked layouts with their predicted step broken down,
why the rest were dropped, and ``--confirm``'s measured beside predicted (from a ``plan`` record, so ``ds-bench
report`` prints the same)."""

from __future__ import annotations

from tabulate import tabulate

from ds_bench.record.plan_schema import PlanRecord
from ds_bench.report.numbers import ms, number

GiB = 1024 ** 3


def render(record: PlanRecord) -> str:
    return "\n".join([header(record), ranked(record), dropped(record)])


def header(r: PlanRecord) -> str:
    c = r.cluster
    intra = ", ".join(f"{k} {v:.3g}" for k, v in c.get("intra_busbw_GBps", {}).items()) or "-"
    nic = f"{c['nic_GBps']:.3g} GB/s per rank across nodes" if c.get("nic_GBps") else "one node"
    domain = c.get("nvlink_domain") or 0
    where = f"an NVLink domain of {domain} GPUs" if domain > c["per_node"] else "a node"
    if domain > c["per_node"] and c.get("nic_GBps"):
        nic = f"{c['nic_GBps']:.3g} GB/s per rank beyond it"
    sources = "; ".join(f"{k}: {v}" for k, v in c.get("sources", {}).items())
    return (f"plan: {r.workload} {r.size} ({r.params / 1e9:.3g}B parameters), seq {r.seq_len}, global batch "
            f"{r.global_batch_tokens:,} tokens ({r.sequences} sequences), {r.precision}\n"
            f"cluster: {c['nodes']} x {c['per_node']} {c['device']}, {c['memory_bytes'] / GiB:.1f} GiB each, peak "
            f"{c['peak_tflops']:.4g} TFLOP/s x achieved {c['achieved']:.2f}, busbw in {where} {intra} GB/s, {nic}\n"
            f"figures from: {sources}\n"
            + (f"--scale {r.scale}: each layout's largest member of the family"
               + (", one sequence per data-parallel replica per step" if r.scale == "seq" else
                  ", the global batch as given") + "\n" if r.scale else "")
            + f"{r.feasible} of {r.candidates} candidates fit and are legal; the best {len(r.ranked)}:")


def ranked(r: PlanRecord) -> str:
    rows = []
    for row in r.ranked:
        comm = sum(row.exposed_s.values())
        busiest = max(row.exposed_s.items(), key=lambda kv: kv[1], default=("", 0.0))
        rows.append([row.rank, row.label, *([largest(row)] if r.scale else []), number(row.tokens_per_s_per_rank),
                     f"{row.mfu:.1%}", ms(row.step_s), ms(row.compute_s), ms(comm, 3)
                     + (f" ({busiest[0]})" if busiest[1] > 0 else ""), ms(row.bubble_s, 3),
                     ms(row.optimizer_s, 3), f"{row.memory_bytes / GiB:.2f}"])
    return tabulate(rows, headers=["#", "layout", *([f"largest ({r.scale})"] if r.scale else []), "tokens/s/rank",
                                   "MFU", "step ms", "compute", "exposed comm", "bubble", "optimizer", "GiB/rank"],
                    disable_numparse=True)


def largest(row) -> str:
    """``--scale``'s answer of a row: ``96 blocks (140B)``, ``h 12,288 (96 heads, 110B)``, ``262,144 tokens``."""
    s = row.scaled
    if s is None:
        return "-"
    params = next(f"{s.params / scale:.3g}{unit}" for scale, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1, ""))
                  if s.params >= scale or unit == "")
    at_least = ">= " if s.capped else ""
    if s.axis == "layers":
        return f"{at_least}{s.layers} blocks ({params})"
    if s.axis == "hidden":
        return f"{at_least}h {s.hidden:,} ({s.heads} heads, {params})"
    return f"{at_least}{s.seq_len:,} tokens"


def dropped(r: PlanRecord) -> str:
    if not r.dropped:
        return "nothing dropped"
    lines = [f"dropped {sum(g.count for g in r.dropped)}:"]
    for g in r.dropped:
        lines.append(f"  {g.count} {g.rule}: e.g. {g.examples[0]}" if g.examples else f"  {g.count} {g.rule}")
    return "\n".join(lines)


def confirmed(r: PlanRecord) -> str:
    rows = []
    for row in r.ranked:
        m = row.confirmed
        if m is None:
            continue
        measured = ms(m.step_s) if m.step_s else m.status
        ratio = f"{m.ratio:.2f}" + (" far off" if m.flagged else "") if m.ratio else "-"
        rows.append([row.rank, row.label, ms(row.step_s), measured, ratio,
                     f"{row.memory_bytes / GiB:.2f}", f"{m.peak_mem_bytes / GiB:.2f}" if m.peak_mem_bytes else "-"])
    table = tabulate(rows, headers=["#", "layout", "predicted step ms", "measured", "predicted/measured",
                                    "predicted GiB", "measured GiB"], disable_numparse=True)
    median = f"median predicted/measured {r.confirm_median_ratio:.2f}" if r.confirm_median_ratio else ""
    return f"{table}\n{median}".rstrip()


def show_last(path: str) -> int:
    """``ds-bench report`` of a plan's results file: its newest plan, as ``ds-bench plan`` printed it."""
    from ds_bench.record import store

    record = store.read_records(path, PlanRecord)[-1]
    print(render(record))
    if any(row.confirmed for row in record.ranked):
        print(confirmed(record))
    return 0 if record.status == "ok" else 1
