"""A cluster's own figures for the performance model, from its records (``ds-bench plan --calibrate FILE``):

- a ``roofline`` record: the ranks' dense matmul TFLOP/s at the plan's precision (the largest size, median over
  ranks) replaces the datasheet peak, and their copy GB/s the memory bandwidth; the device's name with it;
- a ``comm`` record: each collective's busbw at every size it measured (a message is timed at the busbw of its own
  size, so many small messages pay their latency) and at its largest: over ranks of one host it is the
  intra-node figure; over several hosts its ``intra`` rows are, and its cross-host rows (``inter``, else
  ``world``) give the network share per rank (busbw / the group's ranks per host);
- an expectations file (``--expect``'s YAML/JSON): its ``comm`` ``busbw_GBps`` ``at_least`` bounds, the cluster's
  own acceptance bar, where no record measured the same (``where.scope``: ``intra``, or ``inter``/``world`` across
  hosts; ``where.collective`` picks the collective, none: ``all_reduce``);
- ``run`` records: the median ``baseline_mem_bytes`` of the ok ones is what a rank holds before its model.
The newest record of each kind in a file wins; later files win over earlier ones. What each figure came from is
kept (``Cluster.sources``)."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field, replace

from ds_bench.errors import UserError
from ds_bench.perf.devices import Cluster
from ds_bench.record.schema import CommRecord, RooflineRecord, RunRecord

EXPECT_SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class Figures:
    """What records measured; None: not measured (the cluster keeps its figure)."""

    device: str | None = None
    peak_tflops: float | None = None
    hbm_GBps: float | None = None
    intra: dict[str, float] = field(default_factory=dict)
    nic_GBps: float | None = None
    reserve_bytes: int | None = None
    curves: dict[str, list[list[float]]] = field(default_factory=dict)
    """``Cluster.curves``: each collective's busbw by message size."""
    sources: dict[str, str] = field(default_factory=dict)


def from_roofline(record: RooflineRecord, precision: str, figures: Figures) -> None:
    where = f"roofline {record.run_id} ({record.time})"
    matmul = [r for r in record.results if r.test == "matmul" and r.dtype == precision]
    if matmul:
        top = max(r.size for r in matmul)
        figures.peak_tflops = statistics.median(r.median for r in matmul if r.size == top)
        figures.device = matmul[0].device
        figures.sources["peak_tflops"] = f"{where}: matmul {precision} n={top}, median over ranks"
    copy = [r.median for r in record.results if r.test == "copy"]
    if copy:
        figures.hbm_GBps = statistics.median(copy)
        figures.sources["hbm_GBps"] = f"{where}: copy"


def from_comm(record: CommRecord, figures: Figures) -> None:
    where = f"comm {record.run_id} ({record.time})"
    hosts = sorted(set(record.hosts))
    per_host = max(1, (record.world_size or len(record.hosts)) // max(1, len(hosts)))
    largest: dict[tuple[str, str], tuple[int, float]] = {}
    curves: dict[tuple[str, str], list[list[float]]] = {}
    for row in record.results:
        if row.wrong or row.busbw_GBps <= 0:
            continue
        scope = "intra" if row.scope == "intra" or (row.scope == "world" and len(hosts) <= 1) else row.scope
        key = (scope, row.collective)
        curves.setdefault(key, []).append([float(row.size_bytes), row.busbw_GBps])
        if key not in largest or row.size_bytes > largest[key][0]:
            largest[key] = (row.size_bytes, row.busbw_GBps)
    for (scope, collective), curve in curves.items():
        if scope == "intra":
            figures.curves[f"intra:{collective}"] = sorted(curve)
    for (scope, collective), (_, busbw) in largest.items():
        if scope == "intra":
            figures.intra[collective] = busbw
            figures.sources[f"intra {collective}"] = where
    across = {c: bw for (s, c), (_, bw) in largest.items() if s == "inter"} or \
             {c: bw for (s, c), (_, bw) in largest.items() if s == "world" and len(hosts) > 1}
    if across:
        busbw = across.get("all_reduce", min(across.values()))
        figures.nic_GBps = busbw / per_host
        scope = "inter" if any(s == "inter" for s, _ in curves) else "world"
        for (s, collective), curve in curves.items():
            if s == scope:
                figures.curves[f"inter:{collective}"] = sorted([size, bw / per_host] for size, bw in curve)
        figures.sources["nic_GBps"] = f"{where}: cross-host busbw {busbw:.3g} GB/s / {per_host} ranks per host"


def from_expectations(path: str, figures: Figures) -> None:
    from ds_bench.record.expect_file import load

    for e in load(path, "--calibrate").expectations:
        if e.kind != "comm" or e.metric != "busbw_GBps" or e.at_least is None:
            continue
        scope = str(e.where.get("scope", "world"))
        collective = str(e.where.get("collective", "all_reduce"))
        if scope == "intra" and collective not in figures.intra:
            figures.intra[collective] = e.at_least
            figures.sources[f"intra {collective}"] = f"{path}: {e.name}"
        elif scope in ("inter", "world") and figures.nic_GBps is None:
            per_node = e.where.get("ranks_per_host")
            figures.nic_GBps = e.at_least / int(per_node or 1)
            figures.sources["nic_GBps"] = f"{path}: {e.name}"


def from_runs(runs: list[RunRecord], figures: Figures) -> None:
    baselines = [r.metrics.baseline_mem_bytes for r in runs if r.status == "ok" and r.metrics.baseline_mem_bytes]
    if baselines:
        figures.reserve_bytes = int(statistics.median(baselines))
        figures.sources["reserve"] = f"median baseline of {len(baselines)} ok run records"


def read(paths: list[str], precision: str) -> Figures:
    """The figures of every file in ``paths`` (module docstring); a ``UserError`` naming a file that is missing or
    holds none of them."""
    from ds_bench.record import store
    from ds_bench.record.schema import Record

    figures = Figures()
    for path in paths:
        if not os.path.isfile(path):
            raise UserError(f"--calibrate {path}: no such file")
        if path.endswith(EXPECT_SUFFIXES):
            from_expectations(path, figures)
            continue
        records = store.read_records(path, Record)
        newest = {kind: next((r for r in reversed(records) if isinstance(r, kind)
                              and getattr(r, "status", "ok") == "ok"), None)
                  for kind in (RooflineRecord, CommRecord)}
        if newest[RooflineRecord]:
            from_roofline(newest[RooflineRecord], precision, figures)
        if newest[CommRecord]:
            from_comm(newest[CommRecord], figures)
        runs = [r for r in records if isinstance(r, RunRecord)]
        from_runs(runs, figures)
        if not any(newest.values()) and not runs:
            raise UserError(f"--calibrate {path}: no roofline, comm or run record in it")
    return figures


def apply(cluster: Cluster, figures: Figures) -> Cluster:
    """``cluster`` with every figure the records measured in place of its own."""
    intra = {**cluster.intra_busbw_GBps, **figures.intra}
    return replace(cluster, peak_tflops=figures.peak_tflops or cluster.peak_tflops,
                   hbm_GBps=figures.hbm_GBps or cluster.hbm_GBps, intra_busbw_GBps=intra,
                   nic_GBps=figures.nic_GBps if figures.nic_GBps and cluster.nodes > 1 else cluster.nic_GBps,
                   reserve_bytes=figures.reserve_bytes or cluster.reserve_bytes,
                   curves={**cluster.curves, **figures.curves},
                   sources={**cluster.sources, **figures.sources})
