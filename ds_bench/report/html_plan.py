"""The HTML report's plan section (``ds-bench plan`` records): per plan, the model, the cluster and where each of
its figures came from, the ranked layouts with the predicted step broken down (and, with ``--confirm``, measured
beside predicted), and why the rest were dropped."""

from __future__ import annotations

from ds_bench.record.plan_schema import PlanRecord
from ds_bench.report.html_page import Cell, heading, note, num, section, status, table
from ds_bench.report.numbers import ms, number

GiB = 1024 ** 3


def plans(records: list[PlanRecord]) -> str:
    parts = []
    for r in records:
        c = r.cluster
        parts.append(heading(f"{r.workload} {r.size} on {c.get('nodes')} x {c.get('per_node')} {c.get('device')} "
                             f"({r.time or '-'})"))
        parts.append(note(f"{r.params / 1e9:.3g}B parameters, seq {r.seq_len}, global batch {r.global_batch_tokens:,} "
                          f"tokens, {r.precision}; {r.feasible} of {r.candidates} candidates fit and are legal. "
                          "Figures from: " + "; ".join(f"{k}: {v}" for k, v in c.get("sources", {}).items())))
        parts.append(table(["#", "layout", "tokens/s/rank", "MFU", "step ms", "compute ms", "exposed comm ms",
                            "bubble ms", "optimizer ms", "GiB/rank", "measured step ms", "predicted/measured"],
                           [_row(row) for row in r.ranked], "plan-table", fit=True))
        if r.confirm_median_ratio:
            parts.append(note(f"median predicted/measured step time over the confirmed layouts: "
                              f"{r.confirm_median_ratio:.2f}"))
        dropped = [[g.rule, num(g.count, "{:d}"), Cell("; ".join(g.examples))] for g in r.dropped]
        if dropped:
            parts.append(table(["dropped because", "candidates", "e.g."], dropped, "plan-dropped-table"))
        if r.recommended_config:
            parts.append(note(f"recommended layout's DeepSpeed config: {r.recommended_config}"))
    return section("plan", "Plan", parts) if parts else ""


def _row(row) -> list:
    m = row.confirmed
    measured = num(m.step_s * 1e3 if m and m.step_s else None, key="measured_step_ms") if (
        not m or m.step_s) else status(m.status)
    ratio = Cell(f"{m.ratio:.2f}" + (" far off" if m.flagged else ""), m.ratio, key="ratio") if m and m.ratio else "-"
    return [num(row.rank, "{:d}"), row.label, num(row.tokens_per_s_per_rank, key="tokens_per_s_per_rank"),
            num(row.mfu * 100, "{:.1f}%"), num(row.step_s * 1e3, key="step_ms"),
            num(row.compute_s * 1e3),
            Cell(", ".join(f"{k} {number(v * 1e3, 3)}" for k, v in row.exposed_s.items() if v > 0) or "0"),
            num(row.bubble_s * 1e3, digits=3), num(row.optimizer_s * 1e3, digits=3),
            num(row.memory_bytes / GiB, "{:.2f}"), measured, ratio]
