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
- ``run`` records: the median ``baseline_mem_bytes`` of the ok ones is what a rank holds before its model, and
  their median TFLOP/s per device (recomputation counted) over the peak the achieved fraction (a one-device run
  measures compute alone: the plan adds the communication).
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
SCOPES = {"intra-host": "intra", "inter-host": "inter"}
"""``ds-bench comm``'s row scopes (``comm.topology``) -> the model's."""


@dataclass
class Figures:
    """What records measured; None: not measured (the cluster keeps its figure)."""

    device: str | None = None
    peak_tflops: float | None = None
    hbm_GBps: float | None = None
    intra: dict[str, float] = field(default_factory=dict)
    nic_GBps: float | None = None
    reserve_bytes: int | None = None
    run_tflops: float | None = None
    """The median TFLOP/s per device (recomputation counted) of the ok run records: what a step achieved here."""
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
        scope = SCOPES.get(row.scope, row.scope)
        if scope == "world" and len(hosts) <= 1:
            scope = "intra"
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
    # inter-host rows: one rank per host, so their busbw is one rank's share already; world rows over several
    # hosts: the share of the host's ranks together
    scope, divisor = ("inter", 1) if any(s == "inter" for s, _ in curves) else ("world", per_host)
    across = {c: bw for (s, c), (_, bw) in largest.items() if s == scope and len(hosts) > 1}
    if across:
        busbw = across.get("all_reduce", min(across.values()))
        figures.nic_GBps = busbw / divisor
        for (s, collective), curve in curves.items():
            if s == scope:
                figures.curves[f"inter:{collective}"] = sorted([size, bw / divisor] for size, bw in curve)
        figures.sources["nic_GBps"] = f"{where}: cross-host busbw {busbw:.3g} GB/s / {divisor} ranks per host"


def from_expectations(path: str, figures: Figures, per_node: int) -> None:
    """``scope: intra-host`` bounds (or ``world`` ones over at most ``per_node`` ranks: one node) are intra-node
    figures; ``inter-host`` ones (one rank per host) a rank's network share; ``world`` ones over more ranks the
    share of a node's ``per_node`` ranks together."""
    from ds_bench.record.expect_file import load

    for e in load(path, "--calibrate").expectations:
        if e.kind != "comm" or e.metric != "busbw_GBps" or e.at_least is None:
            continue
        scope = SCOPES.get(str(e.where.get("scope", "world")), str(e.where.get("scope", "world")))
        ranks = e.where.get("world_size")
        if scope == "world" and isinstance(ranks, int) and ranks <= per_node:
            scope = "intra"
        collective = str(e.where.get("collective", "all_reduce"))
        if scope == "intra" and collective not in figures.intra:
            figures.intra[collective] = e.at_least
            figures.sources[f"intra {collective}"] = f"{path}: {e.name}"
        elif scope in ("inter", "world") and figures.nic_GBps is None:
            figures.nic_GBps = e.at_least / (1 if scope == "inter" else per_node)
            figures.sources["nic_GBps"] = f"{path}: {e.name}"


def from_runs(runs: list[RunRecord], figures: Figures) -> None:
    ok = [r for r in runs if r.status == "ok"]
    baselines = [r.metrics.baseline_mem_bytes for r in ok if r.metrics.baseline_mem_bytes]
    if baselines:
        figures.reserve_bytes = int(statistics.median(baselines))
        figures.sources["reserve"] = f"median baseline of {len(baselines)} ok run records"
    rates = [r.metrics.hardware_tflops_per_device or r.metrics.tflops_per_device for r in ok]
    rates = [x for x in rates if x]
    if rates:
        figures.run_tflops = statistics.median(rates)
        figures.sources["achieved"] = (f"median {figures.run_tflops:.4g} TFLOP/s per device of {len(rates)} ok run "
                                       "records / the peak")


def read(paths: list[str], precision: str, per_node: int = 1) -> Figures:
    """The figures of every file in ``paths`` (module docstring); a ``UserError`` naming a file that is missing or
    holds none of them."""
    from ds_bench.record import store
    from ds_bench.record.schema import Record

    figures = Figures()
    for path in paths:
        if not os.path.isfile(path):
            raise UserError(f"--calibrate {path}: no such file")
        if path.endswith(EXPECT_SUFFIXES):
            from_expectations(path, figures, per_node)
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
    """``cluster`` with every figure the records measured in place of its own. A GPU's measured ceiling becomes its
    peak, MFU stays quoted against the datasheet's, and the family's achieved fraction (of the datasheet) is rescaled
    to the ceiling, so the compute rate moves only when run records measure what a step achieves (their TFLOP/s
    over the peak)."""
    intra = {**cluster.intra_busbw_GBps, **figures.intra}
    peak, achieved, mfu_peak = cluster.peak_tflops, cluster.achieved, cluster.mfu_peak_tflops
    if figures.peak_tflops:
        if cluster.device_type == "cuda":
            achieved, mfu_peak = min(1.0, achieved * peak / figures.peak_tflops), mfu_peak or peak
        peak = figures.peak_tflops
    if figures.run_tflops:
        achieved = min(1.0, figures.run_tflops / peak)
    return replace(cluster, peak_tflops=peak, achieved=achieved, mfu_peak_tflops=mfu_peak,
                   hbm_GBps=figures.hbm_GBps or cluster.hbm_GBps, intra_busbw_GBps=intra,
                   nic_GBps=figures.nic_GBps if figures.nic_GBps and cluster.nodes > 1 else cluster.nic_GBps,
                   reserve_bytes=figures.reserve_bytes or cluster.reserve_bytes,
                   curves={**cluster.curves, **figures.curves},
                   sources={**cluster.sources, **figures.sources})
