"""Plots of results records (matplotlib, headless): throughput and peak memory per run."""

from __future__ import annotations

import os

MIB = 2**20


def _label(r: dict) -> str:
    from ds_bench.report.summary import config_name

    return f"{r['workload']} {config_name(r)} {r.get('precision')} x{r.get('world_size')}"


def bench_plot(records: list[dict], path: str) -> bool:
    """Two bar charts side by side; returns False when no record has metrics."""
    ok = [r for r in records if r.get("status") == "ok" and r.get("metrics")]
    if not ok:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [_label(r) for r in ok]
    x = list(range(len(ok)))  # numeric positions: equal labels must not stack onto one bar
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 1.6 * len(ok)), 4))
    ax1.bar(x, [r["metrics"]["samples_per_s"] for r in ok], color="tab:blue")
    ax1.set_ylabel("samples/s (global)")
    ax1.set_title("Throughput (warm-up excluded)")
    ax2.bar(x, [r["metrics"]["peak_mem_bytes"] / MIB for r in ok], color="tab:orange")
    ax2.set_ylabel("MiB (max over ranks)")
    ax2.set_title("Peak memory per rank")
    for ax in (ax1, ax2):
        ax.set_xticks(x, labels, rotation=30, ha="right", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
