"""A cluster from a device family's datasheet row (``perf.devices.DEVICES``) and the dense peak table
(``measure.peaks``): what ``ds-bench plan --device`` models and what a published run ran on. The one ``perf`` module
that reads ``measure/`` (a study that rebuilds a recorded cluster, ``sweep --prune-predicted``, imports
``perf.devices`` and stays off the run path)."""

from __future__ import annotations

from ds_bench.errors import UserError
from ds_bench.measure.peaks import peak_tflops
from ds_bench.perf.devices import DEVICES, Cluster, Device, device_row


def cluster_of(device: str, nodes: int, per_node: int, precision: str, *, peak: float | None = None,
               memory_bytes: int | None = None, nvlink_domain: int | None = None) -> Cluster:
    """A cluster from a family's datasheet row (``--device``), its figures overridden by ``peak`` (TFLOP/s),
    ``memory_bytes`` and ``nvlink_domain`` (GPUs one NVLink fabric joins); a ``UserError`` naming what is missing
    for a device the table does not know."""
    if nodes < 1 or per_node < 1:
        raise UserError(f"--nodes {nodes} and --gpus-per-node {per_node} must be positive")
    row = device_row(device)
    table_peak, why = peak_tflops(row.family if row else device, "cuda", precision)
    peak = peak or table_peak
    memory = memory_bytes or (row.memory_bytes if row else None)
    if peak is None and row is not None:
        raise UserError(f"--device {device}: {row.family} has no {precision} peak ({why}); give another --precision "
                        "or --peak-tflops")
    if peak is None or memory is None:
        known = ", ".join(d.family for d in DEVICES.values())
        missing = " and ".join(f for f, v in (("--peak-tflops", peak), ("--device-memory", memory)) if v is None)
        raise UserError(f"--device {device}: not a known family ({known}); give {missing}")
    row = row or Device(device, memory, 2000.0, 0.0, 0.0, 0.4)
    sources = {"peak_tflops": f"{row.family} {precision} dense peak (ds_bench.measure.peaks)" if not peak
               or peak == table_peak else "--peak-tflops", "memory": "--device-memory" if memory_bytes else
               f"{row.family} datasheet", "busbw": f"{row.family} nccl-tests-level defaults (docs/plan.md)",
               "achieved": f"{row.unfitted} constant: no published {row.family} run to fit one (docs/plan.md)"
               if row.unfitted else f"{row.family} family constant (docs/plan.md)"}
    return Cluster(nodes, per_node, "cuda", row.family, memory, peak, row.achieved,
                   {"all_reduce": row.intra_busbw_GBps} if row.intra_busbw_GBps else {},
                   (row.nic_GBps or None) if nodes > 1 else None, row.hbm_GBps, row.host_GBps,
                   row.reserve_bytes, sources, host_memory_bytes=row.host_memory_bytes,
                   nvlink_domain=row.nvlink_domain if nvlink_domain is None else nvlink_domain)
