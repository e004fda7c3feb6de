"""A run summary's lines of its parallel degrees, from the record's ``degrees`` map and the degree registry
(``ds_bench.config.degrees``): for each degree its block (the degree's own words, ``Degree.summary``), its
collectives in one shape, and what else it measured; the batch's data-parallel factor. Nothing here names a
degree: a registered degree's block is summarised as it is recorded."""

from __future__ import annotations

from ds_bench.config.degrees import DEGREES
from ds_bench.record.schema import RunRecord


def replicas(record: RunRecord) -> str:
    """What the batch multiplies by: the world size, or with degrees whose groups share a batch (the record's
    layout, every registered degree), the data-parallel replicas and those degrees."""
    layout = record.layout or {}
    shared = [f"{d.word}{layout[d.field]}" for d in DEGREES if d.splits_replica and (layout.get(d.field) or 1) > 1]
    if not shared:
        return str(record.world_size)
    return f"{record.data_parallel_size or '?'} data-parallel ({' '.join(shared)})"


def degree_lines(record: RunRecord) -> list[str]:
    """Each degree that ran: its block, then its collectives and load balance (``DegreeBlock``)."""
    lines = []
    for field, block in (record.degrees or {}).items():
        degree = DEGREES[field] if field in DEGREES.fields() else None
        word = degree.word if degree else field
        lines.append(f"  {word:<12} {_block(degree, word, block.size, block.settings or {})}")
        tail = "; ".join(part for part in (_comm(degree, block.comm), _measured(block.measured)) if part)
        if tail:
            lines.append(f"  {word + ' comm':<12} {tail}")
    return lines


def _block(degree, word: str, size: int, settings: dict) -> str:
    if degree is not None and degree.summary is not None:
        return degree.summary(size, settings)
    return ", ".join([f"{word}{size}", *(f"{key} {value}" for key, value in settings.items() if value is not None)])


def _comm(degree, comm) -> str:
    if comm is None:
        return ""
    if not comm.calls_per_step:
        return f"no {_plural(comm.collective)} (size 1)"
    owner = degree.called + ("'" if degree.called.endswith("s") else "'s") if degree else "its"
    return (f"{comm.ms_per_step:.1f} ms per step in {owner} {_plural(comm.collective)} ({comm.share_of_step:.1%} of "
            f"rank 0's step), {comm.calls_per_step} {_plural(comm.collective)} per step")


def _plural(collective: str) -> str:
    return collective.replace("_", "-") + "s"


def _measured(measured: dict | None) -> str:
    if not measured or measured.get("load_max_over_mean") is None:
        return ""
    return (f"load max/mean {measured['load_max_over_mean']:.2f} (worst step {measured['load_max_over_mean_worst']:.2f}), "
            f"{measured['dropped_share']:.1%} of routes dropped")
