"""The HTML report's fabric sections: collectives (busbw against message size per collective and scope,
the intra-/inter-host split, the host-pair matrix as a heat map with its slow links and suspect hosts) and
scaling (per point: throughput per device and weak-scaling efficiency, table and plot).

busbw is nccl-tests' bus bandwidth (GB/s = 1e9 bytes/s; ``ds_bench.comm.bandwidth``), the scaling
efficiency the records' own (``ds_bench.scaling.efficiency``). "" when there is nothing to show.
"""

from __future__ import annotations

from ds_bench.record.schema import CommRecord, CommRow, ScalingRecord
from ds_bench.report.html_page import Cell, esc, heading, note, num, section, status, svg_plot, table
from ds_bench.report.scaling_table import title as scaling_title


def _size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def comm(records: list[CommRecord]) -> str:
    if not records:
        return ""
    parts = []
    for i, r in enumerate(records):
        device = (r.hardware or {}).get("device", "-")
        parts.append(heading(f"comm {r.run_id or i + 1}: {r.world_size} ranks on {len(set(r.hosts))} host(s), "
                             f"{r.backend}, {device}, {r.dtype}"))
        measured = [row for row in r.results if row.scope != "pair"]
        if measured:
            _busbw_plot(parts, measured)
            parts.append(table(["scope", "group", "collective", "size", "time us (median)", "algbw GB/s",
                                "busbw GB/s", "wrong"], [_row(row) for row in measured], f"comm-table-{i}"))
        pairs = [row for row in r.results if row.scope == "pair" and row.group]
        if pairs:
            parts += _pairs(r, pairs)
        parts += [f'<p class="failed">problem: {esc(p)}</p>' for p in r.problems]
    return section("comm", "Collectives", parts)


def _row(row: CommRow) -> list:
    return [row.scope, row.group or "-", row.collective, Cell(_size(row.size_bytes), row.size_bytes),
            num(row.time_us_median if row.time_us_median is not None else row.time_us),
            num(row.algbw_GBps, key="algbw_GBps"), num(row.busbw_GBps, key="busbw_GBps"),
            status("; ".join(row.wrong)) if row.wrong else Cell("0")]


def _busbw_plot(parts: list[str], rows: list[CommRow]) -> None:
    lines: dict[tuple[str, str], list[CommRow]] = {}
    for row in rows:
        lines.setdefault((row.collective, row.scope if row.scope == "world" else f"{row.scope} {row.group}"),
                         []).append(row)
    with svg_plot(parts, figsize=(8, 3.8), title="busbw against message size") as (_, ax):
        for (collective, scope), members in lines.items():
            members.sort(key=lambda row: row.size_bytes)
            ax.plot([m.size_bytes for m in members], [m.busbw_GBps for m in members], "o-", markersize=3,
                    label=f"{collective} ({scope})")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size, bytes (log2)")
        ax.set_ylabel("busbw, GB/s (nccl-tests)")
        ax.set_title("Bus bandwidth against message size")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)


def _pairs(r: CommRecord, pairs: list[CommRow]) -> list[str]:
    """The largest size's busbw of every host pair, as a matrix (heat map) and a table; the slow links
    and the suspect hosts as ``--pairs`` found them."""
    largest = max(row.size_bytes for row in pairs)
    best = {row.group: row.busbw_GBps for row in pairs if row.size_bytes == largest}
    hosts = sorted({h for link in best for h in _ends(link)})
    parts = [heading(f"host pairs at {_size(largest)} (send/recv busbw, GB/s)")]
    grid = [[None] * len(hosts) for _ in hosts]
    for link, value in best.items():
        a, b = (hosts.index(h) for h in _ends(link))
        grid[a][b] = grid[b][a] = value
    with svg_plot(parts, figsize=(1.2 + 0.9 * len(hosts), 0.9 + 0.75 * len(hosts)), title="host-pair busbw heat map") as (fig, ax):
        import numpy as np

        data = np.array([[np.nan if v is None else v for v in row] for row in grid], dtype=float)
        image = ax.imshow(data, cmap="viridis")
        top = np.nanmax(data)
        ax.set_xticks(range(len(hosts)), hosts, rotation=30, ha="right", fontsize=8)
        ax.set_yticks(range(len(hosts)), hosts, fontsize=8)
        for a in range(len(hosts)):
            for b in range(len(hosts)):
                if grid[a][b] is not None:
                    ink = "black" if grid[a][b] > 0.6 * top else "white"  # viridis is light at its top
                    ax.text(b, a, f"{grid[a][b]:.3g}", ha="center", va="center", color=ink, fontsize=8)
        fig.colorbar(image, ax=ax, label="GB/s")
        ax.set_title("busbw per host pair")
    slow = {s.get("link") for s in r.slow_links or []}
    rows = [[link, num(value, key="pair_busbw_GBps"), status("slow") if link in slow else Cell("")]
            for link, value in sorted(best.items(), key=lambda item: item[1])]
    parts.append(table(["link", "busbw GB/s", "slow"], rows, "pairs-table"))
    parts += [f'<p class="failed">slow link {esc(s.get("link"))}: {s.get("busbw_GBps") or 0:.3g} GB/s, '
              f'{s.get("vs_best_pct") or 0:.0f}% below the best</p>' for s in r.slow_links or []]
    parts += [f'<p class="failed">suspect host {esc(h)}: every link through it is slow</p>'
              for h in r.suspect_hosts or []]
    return parts


def _ends(link: str) -> tuple[str, str]:
    """``hosta<->hostb`` (``ds_bench.comm.pairs``' link name) -> its two hosts."""
    a, _, b = link.partition("<->")
    return a, b or a


def scaling(records: list[ScalingRecord]) -> str:
    if not records:
        return ""
    parts = []
    for i, r in enumerate(records):
        parts.append(heading(f"scaling {r.scaling} ({r.time or '-'}): {scaling_title(r)}"))
        rows = [[num(p.world_size, "{:d}"), num(p.nodes, "{:d}"), num(p.global_batch, "{:d}"),
                 num(p.samples_per_s, key="samples_per_s"),
                 num(p.samples_per_s_per_device, key="samples_per_s_per_device"),
                 num(p.step_ms_median), num(p.efficiency, "{:.3f}", key="efficiency"),
                 status(p.status), p.reason or ""] for p in r.points]
        parts.append(table(["ranks", "nodes", "global batch", f"{r.points[0].unit if r.points else ''}",
                            "per device", "step ms p50", "efficiency", "status", "reason"], rows, f"scaling-table-{i}"))
        ok = [p for p in r.points if p.status == "ok" and p.efficiency is not None]
        if ok:
            with svg_plot(parts, figsize=(7, 3.4), title="weak-scaling efficiency") as (_, ax):
                ax.plot([p.world_size for p in ok], [p.efficiency for p in ok], "o-", color="tab:orange")
                ax.axhline(1.0, color="grey", linestyle="--", label="ideal")
                ax.set_xscale("log", base=2)
                ax.set_xticks([p.world_size for p in ok], [str(p.world_size) for p in ok])
                ax.set_ylim(0, max(1.1, *(p.efficiency * 1.1 for p in ok)))
                ax.set_xlabel("ranks")
                ax.set_ylabel("efficiency (per-device vs smallest)")
                ax.set_title("Weak-scaling efficiency")
        parts += [note(n) for n in r.notes]
    return section("scaling", "Scaling", parts)
