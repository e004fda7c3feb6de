"""A scaling point's row from its run record, and weak-scaling efficiency (pure).

Weak scaling keeps the work per device fixed (here: the micro-batch and gradient accumulation per
rank), so the global batch grows with the rank count. Its efficiency at N devices is
``E(N) = t(N_0) / t(N)``, the time for a fixed amount of work per device at the smallest run ``N_0``
over that at N (the usual HPC definition; e.g. Hager & Wellein, *Introduction to High Performance
Computing for Scientists and Engineers*, 2010, ch. 5). With a fixed batch per device, time per
sample per device is the inverse of per-device throughput, so

    efficiency(N) = (samples/s per device at N) / (samples/s per device at N_0)

which is also Horovod's "scaling efficiency" (Sergeev & Del Balso, arXiv:1802.05799: throughput at
N over N times the throughput of one device). 1.0 is perfect; below 1.0, communication and
stragglers cost time. ``N_0`` is the smallest point that ran ok (normally the smallest asked for).
Throughputs are the run's own (``ds_bench.measure.metrics``): global samples over the measured steps' summed
straggler step times, warm-up excluded, and that divided by the world size.
"""

from __future__ import annotations

from ds_bench.jobs.slurm_batch import slurm_block
from ds_bench.record.schema import Busy, RunRecord, ScalingRow


def row(point, status: str, reason: str | None, run: RunRecord | None, *, tag: str, log: str | None,
        wall_s: float | None = None, busy: dict | None = None, slurm=None) -> ScalingRow:
    """One table row; ``run`` is the point's ok run record (None for a failed point); ``slurm``: the point's
    ``SlurmEnd`` under ``--executor slurm`` (its hosts are then the run's)."""
    m = run.metrics if run is not None else None
    ok = status == "ok" and m is not None
    return ScalingRow(
        world_size=point.world_size, nodes=point.nodes, ranks_per_node=point.per_node,
        hosts=[h for h, _ in point.hosts] or list(dict.fromkeys((slurm and run and run.hosts) or [])),
        status=status, reason=reason, tag=tag,
        run_id=run and run.run_id, log=log, torch_threads=run and run.hardware.get("torch_threads"),
        micro_batch=run and run.micro_batch, grad_accum=run and run.grad_accum,
        global_batch=run and run.train_batch_size,
        unit=f"{(m and m.sample_unit) or 'samples'}/s",
        samples_per_s=m.samples_per_s if ok else None,
        samples_per_s_per_device=m.samples_per_s_per_device if ok else None,
        tokens_per_s_per_device=m.tokens_per_s / point.world_size if ok and m.tokens_per_s else None,
        step_ms_median=m.step_ms_median if ok else None,
        step_ms_p90=m.step_ms_p90 if ok else None,
        efficiency=None, wall_s=wall_s, busy=Busy(**busy) if busy is not None else None, **slurm_block(slurm),
    )


def point_status(classified: str, reason: str | None, run: RunRecord | None, world_size: int) -> tuple[str, str | None]:
    """``ok`` or ``failed`` with the reason (``ds_bench.jobs.outcome.classify``'s status kept in it)."""
    if classified != "ok":
        return "failed", f"{classified}: {reason or '-'}"
    if run is None or run.world_size != world_size:
        return "failed", f"the run record says {run and run.world_size} rank(s), expected {world_size}"
    return "ok", None


def with_efficiency(rows: list[ScalingRow]) -> tuple[list[ScalingRow], int | None]:
    """Rows with ``efficiency`` filled in for ok points, and the baseline's world size (None: no ok
    point). Rows are in ascending world size; the baseline is the first ok one."""
    base = next((r for r in rows if r.status == "ok"), None)
    if base is None:
        return [r.model_copy() for r in rows], None
    out = [r.model_copy(update={"efficiency": efficiency(r.samples_per_s_per_device, base.samples_per_s_per_device)})
           if r.status == "ok" else r.model_copy() for r in rows]
    return out, base.world_size


def efficiency(per_device: float, base_per_device: float) -> float:
    return per_device / base_per_device


def notes(rows: list[ScalingRow], cores: int | None, device_type: str) -> list[str]:
    """What makes the figures less comparable than they look: threads per rank that differ, a per-device
    batch that changed, CPU ranks beyond the cores of a node, other work on the machine meanwhile."""
    from ds_bench.jobs.outcome import was_busy

    ok = [r for r in rows if r.status == "ok"]
    out = []
    busy = [r.world_size for r in rows if was_busy(r, cores)]
    if busy:
        out.append(f"the machine was busy during the point(s) at {', '.join(map(str, busy))} rank(s) (other processes "
                   "used CPU or GPU time, the records' 'busy'): their figures may be low")
    threads = sorted({r.torch_threads for r in ok if r.torch_threads is not None})
    if device_type == "cpu" and len(threads) > 1:
        out.append(f"torch threads per rank differ between points ({', '.join(map(str, threads))}): "
                   "the points do not run the same CPU device")
    per_device = sorted({(r.micro_batch, r.grad_accum) for r in ok})
    if len(per_device) > 1:
        out.append(f"micro-batch x accumulation per device differs between points ({per_device}): not weak scaling")
    if device_type == "cpu" and cores:
        over = [r.world_size for r in rows if r.ranks_per_node * max(1, r.torch_threads or 1) > cores]
        if over:
            out.append(f"at {', '.join(map(str, over))} rank(s) the ranks x threads on a node exceed its {cores} cores: "
                       "those points measure oversubscription, not scaling")
    return out
