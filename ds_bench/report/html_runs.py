"""The HTML report's sections about the machines and the runs: machine and versions, doctor, runs
(throughput, MFU, memory, step-time spread, loss curves) and failures (of every kind of record; a capacity
probe's out-of-memory is its search's bound, not a failure).

Each function takes the records of its kinds and returns the section's HTML, or "" when there is nothing
to show. Units as the tables say: MiB = 2^20 bytes, ms, GB/s = 1e9 bytes/s, TFLOP/s = 1e12 FLOP/s.
"""

from __future__ import annotations

from ds_bench.record.schema import (CapacityProbeRecord, CapacityRecord, CommRecord, DoctorRecord, Record,
                                    RooflineRecord, RunRecord, ScalingRecord, Stamped, SweepPointRecord)
from ds_bench.report.capacity_notes import expected_oom_runs
from ds_bench.report.html_page import Cell, esc, heading, note, num, section, status, svg_plot, table
from ds_bench.report.numbers import number
from ds_bench.report.summary import config_name, one_per_run

MIB = 2**20
VERSION_KEYS = ("python", "torch", "deepspeed", "transformers", "cuda", "nccl")


def machines(records: list[Record]) -> str:
    """One row per (host, device, versions) that wrote a record, with the first and last time seen."""
    seen: dict[tuple, list] = {}
    for r in records:
        if not isinstance(r, Stamped) or not r.host:
            continue
        device = str((getattr(r, "hardware", None) or {}).get("device") or "-")
        key = (r.host, device, *(r.versions.get(k) for k in VERSION_KEYS), (r.git_sha or "")[:12])
        entry = seen.setdefault(key, [r.time, r.time, 0])
        entry[1], entry[2] = r.time or entry[1], entry[2] + 1
    if not seen:
        return ""
    rows = [[*(k or "-" for k in key), first or "-", last or "-", num(count, "{:d}")]
            for key, (first, last, count) in seen.items()]
    headers = ["host", "device", *VERSION_KEYS, "git sha", "first record", "last record", "records"]
    return section("machine", "Machine and versions", [table(headers, rows, "machine-table")])


def doctor(records: list[DoctorRecord]) -> str:
    if not records:
        return ""
    parts = []
    for i, d in enumerate(records):
        parts.append(heading(f"doctor {i + 1}: {len(d.ranks)} rank(s)"))
        rows = [[str(f.get("rank", "-")), f.get("host"), ", ".join(map(str, f.get("devices") or [f.get("device") or "-"])),
                 f.get("launcher"), "; ".join(f.get("interfaces") or [])] for f in d.ranks]
        parts.append(table(["rank", "host", "devices", "launcher", "interfaces"], rows))
        if d.busbw_GBps is not None and d.allreduce_ms is not None:
            parts.append(note(f"all_reduce of {d.allreduce_bytes or 0:,} bytes over all ranks: "
                              f"{number(d.allreduce_ms, 3)} ms, busbw {number(d.busbw_GBps, 3)} GB/s"))
        for link in d.links or []:
            parts.append(note(f"link {link.get('link') or link.get('group') or ''}: "
                              + ", ".join(f"{k} {v}" for k, v in link.items() if k not in ("link", "group"))))
        roof = [[row.get("host"), row.get("device"), row.get("test"), row.get("dtype"),
                 num(row.get("median"), key="roofline_median")] for row in d.roofline or []]
        if roof:
            parts.append(table(["host", "device", "test", "dtype", "median (TFLOP/s or GB/s)"], roof))
        parts += [f'<p class="failed">problem: {esc(p)}</p>' for p in d.problems] or [note("no problem found")]
    return section("doctor", "Doctor", parts)


def roofline(records: list[RooflineRecord]) -> str:
    """Every rank's measured ceiling (``ds-bench roofline``): TFLOP/s of dense matmuls, GB/s of copies."""
    rows = [[r.time or "-", num(row.rank, "{:d}"), row.host, row.device, row.test, row.dtype,
             "x".join(map(str, row.shape)) if row.shape else f"{row.size:,}",
             num(row.median, key="roofline_median"), f"{number(row.low)}-{number(row.high)}",
             "GB/s" if row.test == "copy" else "TFLOP/s"]
            for r in records for row in r.results]
    if not rows:
        return ""
    return section("roofline", "Measured ceiling", [table(
        ["recorded", "rank", "host", "device", "test", "dtype", "size", "median", "low-high", "unit"], rows,
        "roofline-table")])


def _run_row(r: RunRecord) -> list:
    m = r.metrics
    return [r.run_id or "-", r.workload + (f"/{r.size}" if r.size else ""), config_name(r), r.engine,
            num(r.zero_stage, "{:d}"), r.precision or "-", num(r.world_size, "{:d}"), num(r.micro_batch, "{:d}"),
            num(m.samples_per_s, key="samples_per_s"), num(m.tokens_per_s, key="tokens_per_s"),
            num(m.step_ms_median, key="step_ms_median"), num(m.step_ms_p90, key="step_ms_p90"),
            num(m.peak_mem_bytes, "{:.0f}", key="peak_mem_bytes", scale=MIB),
            num(m.tflops_per_device, digits=3, key="tflops_per_device"), num(m.mfu, "{:.3f}", key="mfu"),
            num(m.loss_last, key="loss_last"), status(r.status or "ok")]


RUN_HEADERS = ["run", "workload", "config", "engine", "zero", "precision", "ranks", "micro-batch", "samples/s",
               "tokens/s", "step ms p50", "step ms p90", "peak MiB", "TFLOP/s per device", "MFU", "loss last",
               "status"]


def runs(records: list[RunRecord]) -> str:
    records = one_per_run(records)
    if not records:
        return ""
    parts = [table(RUN_HEADERS, [_run_row(r) for r in records], "runs-table")]
    ok = [r for r in records if r.status in (None, "ok") and r.metrics.step_ms_median is not None]
    if ok:
        with svg_plot(parts, 1, 2, figsize=(11, 3.6), title="step time and loss per run") as (_, (ax1, ax2)):
            _step_time_plot(ax1, ok)
            _loss_plot(ax2, ok)
    return section("runs", "Runs", parts)


def _step_time_plot(ax, ok: list[RunRecord]) -> None:
    """Per run: the min-max range of its measured step times, the median (dot) and p90 (tick)."""
    for i, r in enumerate(ok):
        m = r.metrics
        ax.vlines(i, m.step_ms_min or m.step_ms_median, m.step_ms_max or m.step_ms_median, color="tab:gray")
        ax.plot(i, m.step_ms_median, "o", color="tab:blue")
        if m.step_ms_p90 is not None:
            ax.plot(i, m.step_ms_p90, "_", color="tab:red", markersize=12)
    ax.set_xticks(range(len(ok)), [(r.run_id or "?")[-8:] for r in ok], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("step ms (min-max, median o, p90 -)")
    ax.set_title("Step time distribution (warm-up excluded)")


def _loss_plot(ax, ok: list[RunRecord]) -> None:
    drawn = False
    for r in ok[:12]:
        if r.metrics.loss_curve:
            ax.plot(range(1, len(r.metrics.loss_curve) + 1), r.metrics.loss_curve, label=(r.run_id or "?")[-8:])
            drawn = True
    ax.set_xlabel("step (warm-up included)")
    ax.set_ylabel("loss (mean over ranks)")
    ax.set_title("Loss curves")
    if drawn:
        ax.legend(fontsize=7)


def failures(records: list[Record]) -> str:
    """Everything that did not end ok, whatever its kind, with its reason; not a capacity probe that ran out of
    memory (nor its run): the search made it to find the limit, and the capacity section shows it as its bound."""
    rows, bound = [], expected_oom_runs(records)
    for r in records:
        if isinstance(r, RunRecord) and r.status == "failed" and r.run_id not in bound:
            rows.append(["run", r.run_id, r.workload, status("failed"), r.failure.kind if r.failure else "-",
                         r.error or "-"])
        elif isinstance(r, SweepPointRecord) and r.status not in ("ok", "skipped"):  # skipped: never meant to run
            rows.append(["sweep point", r.sweep, r.key, status(r.status), r.status, r.reason or "-"])
        elif isinstance(r, ScalingRecord):
            rows += [["scaling point", r.scaling, f"{p.world_size} ranks", status(p.status), "-", p.reason or "-"]
                     for p in r.points if p.status != "ok"]
        elif isinstance(r, CommRecord) and (r.status != "ok" or r.problems):
            rows.append(["comm", r.run_id, f"{r.world_size} ranks", status(r.status), "-", "; ".join(r.problems) or "-"])
        elif isinstance(r, CapacityProbeRecord) and r.status not in ("ok", "oom"):
            rows.append(["capacity probe", r.capacity, f"{r.layout} {r.member}", status(r.status), "-", r.reason or "-"])
        elif isinstance(r, CapacityRecord) and r.status == "failed":
            rows.append(["capacity", r.capacity, r.layout, status(r.status), "-", r.reason or "-"])
        elif getattr(r, "kind", None) == "plan" and r.status != "ok":
            bad = [row for row in r.ranked if row.confirmed and row.confirmed.status != "ok"]
            rows += [["plan --confirm", r.run_id, row.label, status(row.confirmed.status), "-",
                      row.confirmed.reason or "-"] for row in bad]
        elif isinstance(r, DoctorRecord) and r.problems:
            rows.append(["doctor", "-", f"{len(r.ranks)} ranks", status("failed"), "-", "; ".join(r.problems)])
    if not rows:
        return section("failures", "Failures", [note("none: every record ended ok")])
    return section("failures", "Failures", [table(["what", "id", "which", "status", "kind", "reason"],
                                                  [[Cell(c) if not isinstance(c, Cell) else c for c in row]
                                                   for row in rows], "failures-table")])
