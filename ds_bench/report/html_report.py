"""``ds-bench report --html PATH RESULTS...``: one self-contained HTML page from any mix of results files
(runs, sweep points, comm, scaling, capacity, doctor; empty files and failed records included).

Sections, each present when the records hold something for it: expectations (with ``--expect``), machine
and versions, doctor, the measured ceiling (roofline), collectives, scaling, sweep, the stacks a study ran on
judged against the first (``html_verdicts``), capacity (answers, the
searches' bound and probes), plan, runs, failures, and the files read. The
page is written whole or not at all (a temporary file beside it, then renamed).
"""

from __future__ import annotations

import os
import tempfile
import time

from ds_bench.record import store
from ds_bench.record.expect_check import Outcome
from ds_bench.record.schema import (CapacityProbeRecord, CapacityRecord, CommRecord, DoctorRecord, PlanRecord, Record,
                                    RooflineRecord, RunRecord, ScalingRecord, SweepPointRecord)
from ds_bench.report import html_capacity, html_comm, html_plan, html_runs, html_sweep, html_verdicts
from ds_bench.report.html_page import note, num, page, section, table


def read(paths: list[str]) -> dict[str, list[Record]]:
    """Every record of each file, in file order (a missing file is a ``UserError``, an empty one holds none)."""
    out = {}
    for path in paths:
        store.check_results_file(path, "RESULTS")
        out[path] = store.read_records(path)
    return out


def sections(by_file: dict[str, list[Record]], outcomes: list[Outcome] | None = None,
             expect_path: str = "") -> list[tuple[str, str, str]]:
    """(id, nav label, HTML) of every section with something to show, in reading order."""
    records = [r for found in by_file.values() for r in found]

    def of(kind: type) -> list:
        return [r for r in records if isinstance(r, kind)]

    parts = [("expectations", "Expectations", html_sweep.expectations(outcomes or [], expect_path)),
             ("machine", "Machine", html_runs.machines(records)),
             ("doctor", "Doctor", html_runs.doctor(of(DoctorRecord))),
             ("roofline", "Ceiling", html_runs.roofline(of(RooflineRecord))),
             ("comm", "Collectives", html_comm.comm(of(CommRecord))),
             ("scaling", "Scaling", html_comm.scaling(of(ScalingRecord))),
             ("sweep", "Sweep", html_sweep.sweep(of(SweepPointRecord))),
             ("stacks", "Stacks", html_verdicts.stacks(records)),
             ("capacity", "Capacity", html_capacity.capacity(of(CapacityRecord), of(CapacityProbeRecord))),
             ("plan", "Plan", html_plan.plans(of(PlanRecord))),
             ("runs", "Runs", html_runs.runs(of(RunRecord))),
             ("failures", "Failures", html_runs.failures(records)),
             ("files", "Files", files(by_file))]
    return [p for p in parts if p[2]]


def files(by_file: dict[str, list[Record]]) -> str:
    rows = []
    for path, found in by_file.items():
        kinds = sorted({getattr(r, "kind", "run") for r in found})
        rows.append([path, num(len(found), "{:d}", key="records"), ", ".join(kinds) or "(empty)"])
    parts = [table(["results file", "records", "kinds"], rows, "files-table")]
    if not any(by_file.values()):
        parts.append(note("no records in these files: nothing was measured yet"))
    return section("files", "Files read", parts)


def write_page(out_path: str, title: str, subtitle: str, parts: list[tuple[str, str, str]]) -> None:
    """The page at ``out_path``, whole: written to a temporary file in its folder, then renamed."""
    folder = os.path.dirname(os.path.abspath(out_path))
    fd, tmp = tempfile.mkstemp(prefix=".report-", suffix=".html", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(page(title, subtitle, parts))
        os.chmod(tmp, 0o644)
        os.replace(tmp, out_path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_report(out_path: str, by_file: dict[str, list[Record]], outcomes: list[Outcome] | None = None,
                 expect_path: str = "") -> int:
    """Writes the page; returns how many sections it has."""
    parts = sections(by_file, outcomes, expect_path)
    count = sum(len(found) for found in by_file.values())
    subtitle = (f"{count} record(s) from {len(by_file)} file(s): {', '.join(by_file)}; "
                f"made {time.strftime('%Y-%m-%d %H:%M:%S %z')}")
    write_page(out_path, "ds_bench report", subtitle, parts)
    return len(parts)

