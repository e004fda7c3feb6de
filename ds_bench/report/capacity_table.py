"""The table of ``ds-bench capacity`` records: per layout the largest model that trained on these ranks
and what became of the next size (columns as BigScience's GPT-2 experiments put them: ranks, layout,
size, time per iteration, throughput, TFLOP/s per device, memory).

Units: parameters in millions (M) or billions (B); s/iter is the median optimizer step (warm-up
excluded); tokens/s over all ranks; TFLOP/s per device from model FLOPs (``ds_bench.workloads.flops``);
peak and capacity in GiB (2^30 bytes) per rank, a peak above the cap marked and explained (``capacity_notes``);
predicted/measured is the memory prediction's ratio. Under the table, the search's bound: per layout its probes
that ran out of memory (the limit it found, no failure).
A ``--scale seq`` search's table names sequence lengths in tokens instead of sizes: the longest that ran and the
next length (``SEQ_HEADERS``).
"""

from __future__ import annotations

from tabulate import tabulate

from ds_bench.config.layout import Layout
from ds_bench.record import store
from ds_bench.record.schema import CapacityMember, CapacityProbeRecord, CapacityRecord
from ds_bench.report.capacity_notes import ABOVE_CAP_NOTE, above_cap, bound_lines, peak_text
from ds_bench.report.numbers import number

HEADERS = ["ranks", "layout", "largest that ran", "params", "next size", "why not", "s/iter", "tokens/s",
           "TFLOP/s/dev", "peak / capacity GiB", "predicted/measured"]
SEQ_HEADERS = [{"largest that ran": "longest sequence", "next size": "next length"}.get(h, h) for h in HEADERS]


def params_text(n: int | None) -> str:
    if not n:
        return "-"
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def layout_text(r: CapacityRecord) -> str:
    """The layout's key with its data-parallel degree, ``pp2 dp1 z1 off=none fp32 mbs=1`` (``Layout.label``); a
    layout whose degrees do not divide the ranks (skipped) has none: its key alone."""
    layout = Layout.from_dict(r.point)
    dp, world = r.data_parallel_size, r.world_size
    return layout.key if dp is not None and world and dp * layout.model_parallel != world else layout.label(dp)


def row(r: CapacityRecord) -> list:
    found, seq = r.largest is not None, r.scale == "seq"
    best, nxt = r.largest or CapacityMember(member="-"), r.next or CapacityMember(member="")
    last = "(--max-seq-len)" if seq else "(family's last)"
    peak, cap = best.peak_mem_bytes, r.capacity_bytes
    ratio = (best.predicted_mem_bytes / peak) if best.predicted_mem_bytes and peak else None
    why = nxt.why or ("-" if found else r.reason or r.status)
    if why == "predicted":
        why = f"predicted {nxt.predicted_mem_bytes / 2**30:.2f} GiB" if nxt.predicted_mem_bytes else why
    return [r.world_size, layout_text(r), _name(best, seq), params_text(best.params),
            _name(nxt, seq) or (last if found else "-"), why,
            f"{best.step_s:.3f}" if best.step_s else "-",
            f"{best.tokens_per_s:,.0f}" if best.tokens_per_s else "-",
            number(best.tflops_per_device, 3),
            peak_text(peak, cap) if cap else "-",
            f"{ratio:.2f}" if ratio else "-"]


def _name(m: CapacityMember, seq: bool) -> str:
    """A member as a cell: its name, or under ``--scale seq`` its length in tokens."""
    return str(m.seq_len) if seq and m.seq_len else m.member


def table(records: list[CapacityRecord]) -> str:
    headers = SEQ_HEADERS if any(r.scale == "seq" for r in records) else HEADERS
    text = tabulate([row(r) for r in records], headers=headers, tablefmt="simple", disable_numparse=True)
    if any(above_cap(r.largest and r.largest.peak_mem_bytes, r.capacity_bytes) for r in records):
        text += "\n" + ABOVE_CAP_NOTE
    return text


def show_last(path: str) -> int:
    """``ds-bench report`` of a capacity results file: the latest search's layouts."""
    records = store.read_records(path, CapacityRecord)
    latest = records[-1].capacity
    mine = [r for r in records if r.capacity == latest]
    print(f"capacity {latest}: {mine[0].family}")
    print(table(mine))
    for line in bound_lines([p for p in store.read_records(path, CapacityProbeRecord) if p.capacity == latest]):
        print(line)
    return 0 if any(r.status == "ok" for r in mine) else 1
