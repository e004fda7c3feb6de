"""What ``ds-bench scaling`` shows: the table (with a units legend) and the plot of a record's points.

Pure apart from ``write_plot`` and ``show_last`` (``ds-bench report`` of a scaling results file).
"""

from __future__ import annotations

from tabulate import tabulate

from ds_bench.record.schema import ScalingRecord, ScalingRow
from ds_bench.report.numbers import number
from ds_bench.report.plots import figure

LEGEND = ("ranks: world size; threads: torch intra-op threads per rank (the run's hardware.torch_threads); "
          "global batch = micro-batch x accumulation x ranks (weak scaling: fixed per device); {unit}: global, "
          "over the measured steps (warm-up excluded); per device = that / ranks; step ms: median and p90 over "
          "the measured steps of the slowest rank's step; efficiency = per-device {unit} / that at {base} "
          "rank(s) (1.00 = perfect weak scaling)")
HEAD = ["ranks", "nodes", "threads", "global batch", "{unit}", "{unit} per device", "step ms median",
        "step ms p90", "efficiency", "status"]


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def body(rows: list[ScalingRow]) -> list[list[str]]:
    return [[str(r.world_size), str(r.nodes), _num(r.torch_threads, "d"), _num(r.global_batch, "d"),
             number(r.samples_per_s), number(r.samples_per_s_per_device),
             number(r.step_ms_median), number(r.step_ms_p90), _num(r.efficiency, ".2f"),
             r.status if r.status == "ok" else f"failed: {brief(r.reason)}"] for r in rows]


def table(rows: list[ScalingRow], base_world: int | None, fmt: str = "simple") -> str:
    unit = next((r.unit for r in rows if r.status == "ok"), "samples/s")
    head = [h.format(unit=unit) for h in HEAD]
    legend = LEGEND.format(unit=unit, base=base_world if base_world is not None else "the smallest ok")
    return tabulate(body(rows), headers=head, tablefmt=fmt, disable_numparse=True) + "\n\n" + legend


def brief(reason: str | None, width: int = 90) -> str:
    text = " ".join((reason or "-").split())
    return text if len(text) <= width else text[:width - 3] + "..."


def title(record: ScalingRecord) -> str:
    v, threads = record.versions, record.threads_per_rank
    return (f"{record.workload} weak scaling, {record.launcher}, {record.device_type}"
            + (f" ({threads} thread(s) per rank)" if threads else "")
            + f", micro-batch {record.micro_batch} per device, torch {v.get('torch')}, deepspeed {v.get('deepspeed')}"
            + (f" (stack {record.stack})" if record.stack else ""))


def write_plot(rows: list[ScalingRow], path: str, title_text: str) -> str:
    """Per-device throughput (with the ideal: flat at the baseline) and efficiency vs ranks."""
    ok = [r for r in rows if r.status == "ok"]
    unit = ok[0].unit if ok else "samples/s"
    with figure(path, 1, 2, figsize=(10, 4)) as (fig, (ax1, ax2)):
        x = [r.world_size for r in ok]
        ax1.plot(x, [r.samples_per_s_per_device for r in ok], marker="o", label="measured")
        if ok:
            ax1.axhline(ok[0].samples_per_s_per_device, color="grey", linestyle="--", label="ideal (weak scaling)")
        ax1.set_ylabel(f"{unit} per device")
        ax1.set_ylim(bottom=0)
        ax2.plot(x, [r.efficiency for r in ok], marker="o", color="tab:orange")
        ax2.axhline(1.0, color="grey", linestyle="--")
        ax2.set_ylabel("weak-scaling efficiency")
        ax2.set_ylim(0, max([1.1, *[r.efficiency * 1.1 for r in ok]]))
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xticks([r.world_size for r in rows], [str(r.world_size) for r in rows])
            ax.set_xlabel("ranks (world size)")
            ax.grid(True, alpha=0.3)
        ax1.legend()
        fig.suptitle(title_text, fontsize=10)
    return path


def show_last(path: str) -> int:
    """``ds-bench report`` of a scaling results file: the latest scaling record's table."""
    from ds_bench.record import store as results

    record = results.read_records(path, ScalingRecord)[-1]
    print(f"scaling {record.scaling} ({record.time}): {title(record)}")
    print(table(record.points, record.baseline_world_size))
    for note in record.notes:
        print(f"note: {note}")
    return 0 if record.status == "ok" else 1
