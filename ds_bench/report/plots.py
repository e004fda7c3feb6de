"""Plots of results records (matplotlib, headless): throughput and peak memory per run; and
``figure``, the one set-up/save/close of a figure that every module's plot goes through."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from ds_bench.record.schema import RunRecord

MIB = 2**20


@contextmanager
def figure(path: str, nrows: int = 1, ncols: int = 1, *, figsize: tuple[float, float]) -> Iterator[tuple]:
    """``with figure(path, 1, 2, figsize=(10, 4)) as (fig, (ax1, ax2)):`` -- ``plt.subplots`` on the headless
    Agg backend; leaving the block normally lays the figure out (tight), creates ``path``'s folder and saves the
    PNG at dpi 100. The figure is closed in every case, an exception in the block included (nothing saved)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=figsize)
    try:
        yield fig, axes
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def _label(r: RunRecord) -> str:
    from ds_bench.report.summary import config_name

    return f"{r.workload} {config_name(r)} {r.precision} x{r.world_size}"


def bench_plot(records: list[RunRecord], path: str) -> bool:
    """Two bar charts side by side; returns False when no record has metrics."""
    ok = [r for r in records if r.status == "ok" and r.metrics.samples_per_s is not None]
    if not ok:
        return False
    labels = [_label(r) for r in ok]
    x = list(range(len(ok)))  # numeric positions: equal labels must not stack onto one bar
    with figure(path, 1, 2, figsize=(max(8, 1.6 * len(ok)), 4)) as (_, (ax1, ax2)):
        ax1.bar(x, [r.metrics.samples_per_s for r in ok], color="tab:blue")
        ax1.set_ylabel("samples/s (global)")
        ax1.set_title("Throughput (warm-up excluded)")
        ax2.bar(x, [r.metrics.peak_mem_bytes / MIB for r in ok], color="tab:orange")
        ax2.set_ylabel("MiB (max over ranks)")
        ax2.set_title("Peak memory per rank")
        for ax in (ax1, ax2):
            ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    return True
