"""The sweep's ranked table: markdown (for the report), CSV (for other tools) and the terminal.

Every point appears, the ones that did not run ok (oom, timeout, crashed, skipped) after the ranked
ones with their reason. Units: throughput in the sweep's unit per second, global (all ranks);
memory in GiB (2^30 bytes) per rank, the max over ranks and over ok repeats; percentages as
defined in ``ds_bench.report.ranking``.
"""

from __future__ import annotations

import csv

from tabulate import tabulate

from ds_bench.config.layout import SWITCHES
from ds_bench.report.ranking import GIB, PointRow, Ranking, fits, format_throughput, recommendation_line

LEGEND = ("rank: by median throughput, '=k' ties within noise; CV: sample std / mean over ok repeats; "
          "vs baseline: median diff %; GiB = 2^30 bytes per rank; headroom: free share of capacity")


NOTE_CHARS = 110
"""Failure reasons are cut to this in the terminal and markdown (a CUDA OOM message runs ~600
characters); the CSV and the results file keep them whole."""


def brief(text: str, limit: int = NOTE_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis (pure)."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "\u2026"


def notes(ranking: Ranking, row: PointRow, limit: int | None = NOTE_CHARS) -> str:
    """Why a row looks the way it does: its failure reason, and the flags a reader must weigh."""
    out = []
    reason = row.reason if row.reason is None or limit is None else brief(row.reason, limit)
    if not row.ran_ok:
        out.append(reason or row.status)
    elif reason:
        out.append(reason)  # some repeats failed
    if row is ranking.recommended:
        out.append("recommended")
    if row is ranking.baseline:
        out.append("baseline")
    if row.ran_ok and not fits(row, ranking.headroom_pct):
        out.append(f"headroom < {ranking.headroom_pct:g}%")
    if row.noisy:
        out.append("noisy")
    if row.busy:
        out.append("busy machine")
    return "; ".join(out)


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _gib(value: int | None) -> float | None:
    return None if value is None else value / GIB


def _throughput_cells(row: PointRow) -> list[str]:
    if not row.ran_ok:
        return ["-", "-"]
    return [format_throughput(row.throughput_median),
            f"{format_throughput(row.throughput_min)}-{format_throughput(row.throughput_max)}"]


BUBBLE_HEADER = "bubble % (schedule)"
"""Pipeline points: measured idle share of the step, mean over stages, beside (P-1)/(m+P-1)."""


def has_pipeline(ranking: Ranking) -> bool:
    return any(r.schedule_bubble is not None for r in ranking.rows)


def has_numerics(ranking: Ranking) -> bool:
    """Whether the sweep varies a switch that changes what is computed (``Switch.numerics``: the optimizer, the
    master states, the sequence-parallel path; and ZenFlow's offload): then each point's loss after its steps is a
    column."""
    return any(getattr(r.point, s.field) for r in ranking.rows for s in SWITCHES if s.numerics) or any(
        r.point.offload == "zenflow" for r in ranking.rows)  # ZenFlow steps some columns less often


def headers(unit: str, pipeline: bool = False, numerics: bool = False) -> list[str]:
    return ["rank", "point", "status", f"median {unit}", f"min-max {unit}", "CV %", "vs baseline %",
            "peak GiB", "predicted GiB", "predicted/measured", "headroom %",
            *([BUBBLE_HEADER] if pipeline else []), *([LOSS_HEADER] if numerics else []), "notes"]


LOSS_HEADER = "loss (step)"
"""The median ok repeat's loss at its last step, and that step."""


def loss_cell(row: PointRow) -> str:
    return "-" if row.loss_last is None else f"{row.loss_last:.4f} ({row.steps})"


def bubble_cell(row: PointRow) -> str:
    if row.schedule_bubble is None:
        return "-"
    measured = "-" if row.bubble is None else f"{row.bubble * 100:.0f}"
    return f"{measured} ({row.schedule_bubble * 100:.0f})"


def cells(ranking: Ranking, row: PointRow, pipeline: bool = False, numerics: bool = False) -> list[str]:
    return [ranking.label(row), row.key, row.status, *_throughput_cells(row), _num(row.cv_pct, "{:.1f}"),
            _num(ranking.diff_pct(row), "{:+.1f}"), _num(_gib(row.peak_mem_bytes), "{:.2f}"),
            _num(_gib(row.predicted_mem_bytes), "{:.2f}"), _num(row.prediction_ratio, "{:.2f}"),
            _num(row.headroom_pct, "{:.0f}"), *([bubble_cell(row)] if pipeline else []),
            *([loss_cell(row)] if numerics else []), notes(ranking, row)]


def _table(ranking: Ranking, unit: str, fmt: str) -> str:
    pipeline, numerics = has_pipeline(ranking), has_numerics(ranking)
    return tabulate([cells(ranking, r, pipeline, numerics) for r in ranking.rows],
                    headers=headers(unit, pipeline, numerics), tablefmt=fmt, disable_numparse=True)


def markdown(ranking: Ranking, unit: str) -> str:
    return "\n\n".join([_table(ranking, unit, "github"), f"**{recommendation_line(ranking, unit)}**",
                        f"_{LEGEND}_"]) + "\n"


def terminal(ranking: Ranking, unit: str) -> str:
    return "\n".join([_table(ranking, unit, "simple"), LEGEND])


CSV_COLUMNS = ["rank", "key", "stage", "offload", "precision", "micro_batch", "grad_accum", "status",
               "reason", "repeats", "repeats_ok", "unit", "throughput_median", "throughput_min",
               "throughput_max", "cv_pct", "diff_pct", "peak_gib", "predicted_gib", "prediction_ratio",
               "headroom_pct", "capacity_gib", "noisy", "busy", "bubble", "schedule_bubble", "loss_last", "notes", "run_id", "log"]


def _csv_row(ranking: Ranking, row: PointRow) -> dict:
    p = row.point
    return {"rank": ranking.label(row), "key": row.key, "stage": p.stage, "offload": p.offload,
            "precision": p.precision, "micro_batch": p.micro_batch, "grad_accum": p.grad_accum,
            "status": row.status, "reason": row.reason, "repeats": row.repeats, "repeats_ok": row.repeats_ok,
            "unit": row.unit, "throughput_median": row.throughput_median, "throughput_min": row.throughput_min,
            "throughput_max": row.throughput_max, "cv_pct": row.cv_pct, "diff_pct": ranking.diff_pct(row),
            "peak_gib": _gib(row.peak_mem_bytes), "predicted_gib": _gib(row.predicted_mem_bytes),
            "prediction_ratio": row.prediction_ratio, "headroom_pct": row.headroom_pct,
            "capacity_gib": _gib(row.capacity_bytes), "noisy": row.noisy, "busy": row.busy,
            "bubble": row.bubble, "schedule_bubble": row.schedule_bubble, "loss_last": row.loss_last,
            "notes": notes(ranking, row, limit=None), "run_id": row.run_id, "log": row.log}


def write_csv(ranking: Ranking, path: str) -> None:
    """One row per point in ranked order; numbers unformatted, empty where unknown."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in ranking.rows:
            writer.writerow({k: ("" if v is None else v) for k, v in _csv_row(ranking, row).items()})
