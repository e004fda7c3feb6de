"""What ``ds-bench compare`` compares: the measurements of a results file, grouped by what makes two of them
comparable (pure).

Each group is a ``Sample``: a key, a label for the table, the metric with its unit and direction, and every
value measured under that key (repeats of a run, of a sweep point, comm runs): a group of one value is a
single sample. The keys:
- a run (``kind: run``, ok): workload, size, ranks, the record's layout key (engine, ZeRO stage, offload,
  precision, micro-batch, accumulation, every parallel degree, attention, compile, the memory switches: an old
  record's is computed as it is read) and the workload's own options (sequence length, the attention that ran,
  checkpoint offload, the experts, router and moe path); metric the global throughput (tokens/s where the
  workload counts tokens, else samples/s);
- a sweep point (ok): workload, size, ranks and the point's key (its ``stack=`` word left out when two stacks
  are compared: ``samples(..., stack=LABEL)`` keeps that stack's points alone); metric its throughput;
- a comm row (a ``comm`` record's row): collective, scope and group, message size, ranks; metric busbw;
- a scaling point (ok): workload, ranks; metric per-device throughput (with ``stack``: the scaling record of that
  stack).
Failed and skipped measurements are left out: a failure is a result of its own, not a slow sample. A run's and a
sweep point's sample also keeps the loss and gradient-norm curves of its first value and its precision, for
``compare_curves``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ds_bench.record.schema import CommRecord, Record, RunRecord, ScalingRecord, SweepPointRecord
from ds_bench.report.compare_curves import curves_of


@dataclass
class Sample:
    key: tuple
    label: str
    metric: str
    unit: str
    higher_is_better: bool = True
    values: list[float] = field(default_factory=list)
    curves: dict[str, list] = field(default_factory=dict)
    """``loss_curve`` and ``grad_norm_curve`` of the first value's run, where it recorded them."""
    precision: str = ""


def samples(records: list[Record], stack: str | None = None) -> dict[tuple, Sample]:
    """Every comparable measurement of ``records``, grouped by key (module docstring), in file order; ``stack``:
    only the sweep points of that stack (``Layout.stack``), keyed without it."""
    out: dict[tuple, Sample] = {}
    for record in records:
        for sample in _measurements(record, stack):
            kept = out.setdefault(sample.key, Sample(sample.key, sample.label, sample.metric, sample.unit,
                                                     sample.higher_is_better, curves=sample.curves,
                                                     precision=sample.precision))
            kept.values.extend(sample.values)
    return out


def stacks_in(records: list[Record]) -> list[str]:
    """The stacks (``Layout.stack`` labels) of the sweep points and scaling records of ``records``, in file order."""
    return list(dict.fromkeys(_stack(r) for r in records if isinstance(r, (SweepPointRecord, ScalingRecord))))


def _stack(record: Record) -> str:
    if isinstance(record, ScalingRecord):
        return record.stack or ""
    return (record.point or {}).get("stack", "")


def _measurements(record: Record, stack: str | None = None) -> list[Sample]:
    if stack is not None:
        if isinstance(record, (SweepPointRecord, ScalingRecord)) and _stack(record) == stack:
            return _sweep_point(record, stack) if isinstance(record, SweepPointRecord) else _scaling(record)
        return []
    if isinstance(record, RunRecord):
        return _run(record)
    if isinstance(record, SweepPointRecord):
        return _sweep_point(record, None)
    if isinstance(record, CommRecord):
        return [Sample(("comm", row.collective, row.scope, row.group, row.size_bytes, record.world_size),
                       f"comm {row.collective} {row.scope}{' ' + row.group if row.group else ''} "
                       f"{_size(row.size_bytes)} {record.world_size} ranks", "busbw", "GB/s", values=[row.busbw_GBps])
                for row in record.results if not row.wrong]
    if isinstance(record, ScalingRecord):
        return _scaling(record)
    return []


def _scaling(record: ScalingRecord) -> list[Sample]:
    return [Sample(("scaling", record.workload, row.world_size), f"scaling {record.workload} {row.world_size} ranks",
                   "per-device throughput", f"{row.unit} per device", values=[row.samples_per_s_per_device])
            for row in record.points if row.status == "ok" and row.samples_per_s_per_device]


def _sweep_point(r: SweepPointRecord, stack: str | None) -> list[Sample]:
    if r.status != "ok" or not r.throughput:
        return []
    key_words = r.key if stack is None else re.sub(r" stack=\S+", "", r.key)
    key = ("sweep", r.workload, r.size, r.world_size, key_words)
    return [Sample(key, f"sweep {' '.join(filter(None, (r.workload, r.size)))} {r.world_size} ranks: {key_words}",
                   "throughput", r.unit or "samples/s", values=[r.throughput], curves=curves_of(r),
                   precision=(r.point or {}).get("precision", ""))]


def _run(r: RunRecord) -> list[Sample]:
    m = r.metrics
    if r.status != "ok" or m is None or not m.samples_per_s:
        return []
    config = r.config or {}
    settings = _degree_settings(r)  # e.g. the moe path that ran and its router's weight: the degrees' own options
    options = (config.get("seq_len"), r.attn_implementation, bool(config.get("checkpoint_offload")),
               config.get("experts"), config.get("top_k"), config.get("capacity_factor") or 0.0, settings)
    key = ("run", r.workload, r.size, r.world_size, r.layout_key or "", options)
    words = [value for _field, items in settings for _key, value in items if isinstance(value, str)]
    label = " ".join(str(part) for part in (
        "run", r.workload, r.size, r.engine, f"x{r.world_size}", r.layout_key, *words,
        "checkpoint-offload" if options[2] else None) if part)
    curves = curves_of(m)
    precision = (r.layout or {}).get("precision", "")
    if m.tokens_per_s:
        return [Sample(key, label, "throughput", "tokens/s", values=[m.tokens_per_s], curves=curves,
                       precision=precision)]
    return [Sample(key, label, "throughput", f"{m.sample_unit or 'samples'}/s", values=[m.samples_per_s],
                   curves=curves, precision=precision)]


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def _degree_settings(r: RunRecord) -> tuple:
    """Each degree's settings as the record gives them (``DegreeBlock.settings``), hashable: runs of one layout
    whose degrees ran otherwise (another moe path, another router weight) are not one measurement."""
    return tuple((field, tuple(sorted((k, v) for k, v in (block.settings or {}).items()
                                      if isinstance(v, (str, int, float, bool, type(None))))))
                 for field, block in sorted((r.degrees or {}).items()))
