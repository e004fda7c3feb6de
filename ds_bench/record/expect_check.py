"""Expectations against measurements: each expectation of a file (``ds_bench.record.expect_file``)
marked ``pass``, ``fail`` or ``not measured`` with its expected and measured values.

A record becomes measurements (``measurements``): a fields dict (what ``where`` matches), a metrics dict
and the device's name. Only what ran ok is measured: ok runs, ok sweep points and scaling points, comm
rows without a wrong result, ok capacity answers (their largest member). The matching values are reduced
to one (the expectation's ``reduce``, median by default) and compared with the bound.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from tabulate import tabulate

from ds_bench.config.degrees import DEGREES
from ds_bench.record.expect_file import FIELDS, METRICS, Expectation, ExpectFile
from ds_bench.record.schema import (CapacityRecord, CommRecord, DoctorRecord, Record, RunRecord, ScalingRecord,
                                    SweepPointRecord)


@dataclass(frozen=True)
class Measurement:
    kind: str
    fields: dict
    metrics: dict
    device: str


@dataclass(frozen=True)
class Outcome:
    expectation: Expectation
    status: str
    """``pass``, ``fail`` or ``not measured``."""
    measured: float | None
    count: int
    """How many measurements matched."""

    @property
    def failed(self) -> bool:
        return self.status == "fail" or (self.status == "not measured" and self.expectation.required)


def _device(hardware: dict | None) -> str:
    return str((hardware or {}).get("device") or "")


def _run(r: RunRecord) -> list[Measurement]:
    if r.status not in (None, "ok"):
        return []
    fields = {name: getattr(r, name) for name in FIELDS["run"]}  # the record's own fields, by the same names
    fields |= {name: (r.layout or {}).get(name) for name in DEGREES.fields()}
    return [Measurement("run", fields, r.metrics.model_dump(), _device(r.hardware))]


def _sweep_point(r: SweepPointRecord) -> list[Measurement]:
    if r.status != "ok":
        return []
    fields = {"workload": r.workload, "size": r.size, "world_size": r.world_size, "key": r.key,
              **{name: r.point.get(name) for name in ("stage", "offload", "precision", "micro_batch")}}
    return [Measurement("sweep_point", fields, {"throughput": r.throughput, "peak_mem_bytes": r.peak_mem_bytes}, "")]


def _comm(r: CommRecord) -> list[Measurement]:
    return [Measurement("comm", {"collective": row.collective, "scope": row.scope, "group": row.group,
                                 "size_bytes": row.size_bytes, "dtype": r.dtype, "world_size": r.world_size,
                                 "backend": r.backend},
                        {"busbw_GBps": row.busbw_GBps, "algbw_GBps": row.algbw_GBps, "time_us": row.time_us},
                        _device(r.hardware))
            for row in r.results if not row.wrong]


def _scaling(r: ScalingRecord) -> list[Measurement]:
    return [Measurement("scaling", {"workload": r.workload, "world_size": p.world_size, "nodes": p.nodes,
                                    "launcher": r.launcher},
                        {name: getattr(p, name) for name in METRICS["scaling"]}, "")
            for p in r.points if p.status == "ok"]


def _capacity(r: CapacityRecord) -> list[Measurement]:
    if r.status != "ok" or r.largest is None:
        return []
    fields = {"family": r.family, "layout": r.layout, "world_size": r.world_size,
              **{name: r.point.get(name) for name in ("stage", "offload", "precision", *DEGREES.fields())}}
    best = r.largest
    return [Measurement("capacity", fields, {"params": best.params, "peak_mem_bytes": best.peak_mem_bytes,
                                             "tokens_per_s": best.tokens_per_s}, "")]


def _doctor(r: DoctorRecord) -> list[Measurement]:
    device = next((str((rank.get("devices") or [rank.get("device")])[0] or "") for rank in r.ranks), "")
    return [Measurement("doctor", {"world_size": len(r.ranks)},
                        {"busbw_GBps": r.busbw_GBps, "allreduce_ms": r.allreduce_ms}, device)]


READERS = {RunRecord: _run, SweepPointRecord: _sweep_point, CommRecord: _comm, ScalingRecord: _scaling,
           CapacityRecord: _capacity, DoctorRecord: _doctor}


def measurements(records: list[Record]) -> list[Measurement]:
    out: list[Measurement] = []
    for r in records:
        reader = READERS.get(type(r))
        if reader is not None:
            out += reader(r)
    return out


def _matches(e: Expectation, m: Measurement) -> bool:
    if m.kind != e.kind or m.metrics.get(e.metric) is None:
        return False
    if e.hardware and e.hardware.lower() not in m.device.lower():
        return False
    if e.min_size_bytes is not None and (m.fields.get("size_bytes") or 0) < e.min_size_bytes:
        return False
    return all(_equal(m.fields.get(name), want) for name, want in e.where.items())


def _equal(have, want) -> bool:
    if isinstance(want, str) or isinstance(have, str):
        return str(have) == str(want)
    return have == want


REDUCERS = {"median": statistics.median, "min": min, "max": max}


def check(e: Expectation, found: list[Measurement]) -> Outcome:
    values = [float(m.metrics[e.metric]) for m in found if _matches(e, m)]
    if not values:
        return Outcome(e, "not measured", None, 0)
    value = REDUCERS[e.reduce](values)
    return Outcome(e, "pass" if e.passes(value) else "fail", value, len(values))


def evaluate(expect: ExpectFile, records: list[Record]) -> list[Outcome]:
    found = measurements(records)
    return [check(e, found) for e in expect.expectations]


def measured_text(o: Outcome) -> str:
    if o.measured is None:
        return "-"
    return f"{o.measured:.4g} ({o.expectation.reduce} of {o.count})" if o.count > 1 else f"{o.measured:.4g}"


def table(outcomes: list[Outcome]) -> str:
    rows = [[o.status.upper() if o.failed else o.status, o.expectation.name,
             f"{o.expectation.kind}.{o.expectation.metric}", o.expectation.bound_text(), measured_text(o)]
            for o in outcomes]
    return tabulate(rows, headers=["result", "expectation", "metric", "expected", "measured"],
                    disable_numparse=True)


def summary_line(outcomes: list[Outcome], source: str) -> str:
    counts = {s: sum(o.status == s for o in outcomes) for s in ("pass", "fail", "not measured")}
    return (f"expectations ({source}): {counts['pass']} pass, {counts['fail']} fail, "
            f"{counts['not measured']} not measured")
