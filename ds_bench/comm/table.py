"""What ``comm`` makes of every rank's samples: rows, the table, the ``--expect-busbw`` gate, the plot.

Pure apart from ``write_plot``. Per (collective, size): time in microseconds, mean over ranks of
each rank's mean per iteration (nccl-tests' default), with the median, min and max over ranks;
algbw and busbw in GB/s (1e9 B/s) from the mean (``ds_bench.comm.bandwidth``); the ranks whose
result was wrong.
"""

from __future__ import annotations

import statistics

from tabulate import tabulate

from ds_bench.comm.bandwidth import algbw_gbps, busbw_gbps
from ds_bench.report.plots import figure

LEGEND = ("size: bytes of the largest buffer (nccl-tests); time: us per operation, mean over ranks of each "
          "rank's mean (min-max over ranks); algbw = size / time; busbw = algbw x 2(n-1)/n (all_reduce), "
          "(n-1)/n (all_gather, reduce_scatter, all_to_all), 1 (broadcast, send_recv); GB/s = 1e9 B/s")


def largest(rows_: list[dict], by: str = "collective") -> dict[str, dict]:
    """Each collective's (or each value of ``by``'s) row at its largest size."""
    out: dict[str, dict] = {}
    for row in rows_:
        if row[by] not in out or row["size_bytes"] > out[row[by]]["size_bytes"]:
            out[row[by]] = row
    return out


def rows(per_rank: list[list[dict]], n: int) -> list[dict]:
    """One row per (collective, size) from every rank's samples (rank order; same sequence on each)."""
    out = []
    for samples in zip(*per_rank):
        first = samples[0]
        seconds = [s["seconds"] for s in samples]
        mean = statistics.fmean(seconds)
        out.append({"collective": first["collective"], "size_bytes": first["size_bytes"], "count": first["count"],
                    "time_us": mean * 1e6, "time_us_median": statistics.median(seconds) * 1e6,
                    "time_us_min": min(seconds) * 1e6, "time_us_max": max(seconds) * 1e6,
                    "algbw_GBps": algbw_gbps(first["size_bytes"], mean),
                    "busbw_GBps": busbw_gbps(first["collective"], n, first["size_bytes"], mean),
                    "wrong": [s["wrong"] for s in samples if s["wrong"]]})
    return out


def gate(rows_: list[dict], expect: dict[str, float]) -> list[str]:
    """One line per collective whose largest-message busbw over all ranks is below what
    ``--expect-busbw`` asks."""
    top = largest([r for r in rows_ if r.get("scope", "world") == "world"])
    return [f"{name} busbw {top[name]['busbw_GBps']:.3g} GB/s at {human_bytes(top[name]['size_bytes'])} is below "
            f"the expected {want:g} GB/s (--expect-busbw)"
            for name, want in expect.items() if name in top and top[name]["busbw_GBps"] < want]


def wrong_results(rows_: list[dict]) -> list[str]:
    return [w for row in rows_ for w in row["wrong"]]


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def table(rows_: list[dict]) -> str:
    scoped = any(r.get("scope", "world") != "world" for r in rows_)
    body = [[*([f"{r['scope']} ({r['group']})"] if scoped else []), r["collective"], human_bytes(r["size_bytes"]), r["count"], f"{r['time_us']:.1f}",
             f"{r['time_us_min']:.1f}-{r['time_us_max']:.1f}", f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}",
             "wrong" if r["wrong"] else "ok"] for r in rows_]
    head = [*(["ranks"] if scoped else []), "collective", "size", "count", "time us", "min-max us", "algbw GB/s", "busbw GB/s", "check"]
    return "\n".join([tabulate(body, headers=head, tablefmt="simple", disable_numparse=True), LEGEND])


def write_plot(rows_: list[dict], path: str, title: str) -> str:
    """busbw vs size, one line per collective, log2 x axis."""
    with figure(path, figsize=(8, 5)) as (_, ax):
        world = [r for r in rows_ if r.get("scope", "world") == "world"]
        for name in dict.fromkeys(r["collective"] for r in world):
            mine = [r for r in world if r["collective"] == name]
            ax.plot([r["size_bytes"] for r in mine], [r["busbw_GBps"] for r in mine], marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("message size (bytes, largest buffer)")
        ax.set_ylabel("busbw (GB/s, nccl-tests definition)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return path
