"""The sweep's figures (matplotlib, headless) and the Pareto front they mark.

Three PNGs per sweep, ``<prefix>_throughput.png``, ``<prefix>_memory.png``, ``<prefix>_pareto.png``:
throughput against micro-batch (one line per family: stage, offload, precision, accumulation; x on
a log2 axis); peak memory per point (measured bars, predicted markers, the capacity as a line); and
throughput against peak memory with the Pareto front and the recommended point.
"""

from __future__ import annotations

from ds_bench.report.plots import figure
from ds_bench.report.ranking import GIB, PointRow, Ranking, rank

PNG_NAMES = ("throughput", "memory", "pareto")


def pareto_front(rows: list[PointRow]) -> list[PointRow]:
    """The ok points with a known peak that no other point dominates (another with memory <= and
    throughput >=, one of them strictly), ordered by peak memory ascending: the most throughput
    to be had for a given memory."""
    pts = [r for r in rows if r.ran_ok and r.peak_mem_bytes is not None]

    def dominates(a: PointRow, b: PointRow) -> bool:
        return (a.peak_mem_bytes <= b.peak_mem_bytes and a.throughput_median >= b.throughput_median
                and (a.peak_mem_bytes < b.peak_mem_bytes or a.throughput_median > b.throughput_median))

    front = [b for b in pts if not any(dominates(a, b) for a in pts)]
    return sorted(front, key=lambda r: (r.peak_mem_bytes, r.throughput_median))


def _unit(rows: list[PointRow]) -> str:
    return next((r.unit for r in rows if r.unit), "samples/s")


def _empty_note(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)


def _throughput_plot(ax, rows: list[PointRow], unit: str) -> None:
    families: dict[tuple, list[PointRow]] = {}
    for r in rows:
        families.setdefault(r.point.family, []).append(r)
    plotted = False
    for members in families.values():
        ok = sorted((r for r in members if r.ran_ok), key=lambda r: r.point.micro_batch)
        failed = [r for r in members if not r.ran_ok]
        if ok:
            line, = ax.plot([r.point.micro_batch for r in ok], [r.throughput_median for r in ok], "o-",
                            label=members[0].point.family_label())
            ax.plot([r.point.micro_batch for r in failed], [0] * len(failed), "x", color=line.get_color())
            plotted = True
    if not plotted:
        _empty_note(ax, "no point ran ok")
        return
    ax.set_xscale("log", base=2)
    ax.set_xlabel("micro-batch per rank (log2; x at 0: did not run ok)")
    ax.set_ylabel(f"{unit} (global, median of repeats)")
    ax.set_title("Throughput vs micro-batch")
    ax.legend(fontsize=8)


def _memory_plot(ax, rows: list[PointRow]) -> None:
    x = list(range(len(rows)))
    ax.bar(x, [(r.peak_mem_bytes or 0) / GIB for r in rows], color="tab:orange", label="measured peak")
    predicted = [(i, r.predicted_mem_bytes / GIB) for i, r in zip(x, rows) if r.predicted_mem_bytes is not None]
    if predicted:
        ax.plot(*zip(*predicted), "kD", markersize=5, label="predicted")
    for capacity in sorted({r.capacity_bytes for r in rows if r.capacity_bytes}):
        ax.axhline(capacity / GIB, color="tab:red", linestyle="--", label=f"capacity {capacity / GIB:.1f} GiB")
    ax.set_xticks(x, [f"{r.key} [{r.status}]" if not r.ran_ok else r.key for r in rows],
                  rotation=35, ha="right", fontsize=7)
    ax.set_ylabel("GiB per rank (2^30 bytes, max over ranks)")
    ax.set_title("Peak memory per point")
    if rows:
        ax.legend(fontsize=8)


def pareto_plot(ax, rows: list[PointRow], recommended: PointRow | None, unit: str) -> None:
    pts = [r for r in rows if r.ran_ok and r.peak_mem_bytes is not None]
    if not pts:
        _empty_note(ax, "no ok point with a measured peak")
        return
    ax.scatter([r.peak_mem_bytes / GIB for r in pts], [r.throughput_median for r in pts],
               color="tab:gray", label="points")
    front = pareto_front(pts)
    ax.plot([r.peak_mem_bytes / GIB for r in front], [r.throughput_median for r in front], "o-",
            color="tab:blue", label="Pareto front")
    for r in front:
        ax.annotate(r.key, (r.peak_mem_bytes / GIB, r.throughput_median), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    if recommended is not None and recommended.peak_mem_bytes is not None:
        ax.scatter([recommended.peak_mem_bytes / GIB], [recommended.throughput_median], marker="*", s=250,
                   color="tab:green", zorder=3, label=f"recommended: {recommended.key}")
    ax.set_xlabel("peak memory per rank, GiB")
    ax.set_ylabel(f"{unit} (global)")
    ax.set_title("Throughput vs peak memory")
    ax.legend(fontsize=8)


def write_plots(rows_or_ranking: list[PointRow] | Ranking, out_prefix: str) -> list[str]:
    """Writes the three PNGs (each says so when there is nothing to draw); returns their paths.
    Given rows rather than a ranking, the recommendation is ``rank``'s with its defaults."""
    ranking = rows_or_ranking if isinstance(rows_or_ranking, Ranking) else rank(list(rows_or_ranking))
    rows, unit = ranking.rows, _unit(ranking.rows)
    paths = [f"{out_prefix}_{name}.png" for name in PNG_NAMES]

    with figure(paths[0], figsize=(7, 4.5)) as (_, ax):
        _throughput_plot(ax, rows, unit)
    with figure(paths[1], figsize=(max(7, 0.5 * len(rows)), 4.5)) as (_, ax):
        _memory_plot(ax, rows)
    with figure(paths[2], figsize=(7, 4.5)) as (_, ax):
        pareto_plot(ax, rows, ranking.recommended, unit)
    return paths
