"""What the sweep shows while it runs: a progress bar of points (stderr) and one line per point
(stdout), with the tail of the log of a point that crashed or timed out."""

from __future__ import annotations

import sys

from tqdm import tqdm

from ds_bench.config.layout import Layout
from ds_bench.record.schema import SweepPointRecord
from ds_bench.report.ranking import GIB
from ds_bench.report.sweep_table import brief

LOG_LINES = 8


class Progress:
    def __init__(self):
        self.bar = None

    def open(self, planned: int):
        self.bar = tqdm(total=planned, unit="point", desc="sweep", file=sys.stderr, dynamic_ncols=True, disable=None)
        return self.bar

    def advance(self, n: int) -> None:
        if self.bar is not None and n > 0:
            self.bar.update(n)

    def grow_if_full(self, n: int) -> None:
        """``--micro-batch auto`` runs more points than planned: make room for ``n`` more."""
        if self.bar is not None and self.bar.n >= self.bar.total:
            self.bar.total += n

    def say(self, point: Layout, status: str, record: SweepPointRecord | None = None, reason: str | None = None,
            log_path: str | None = None) -> None:
        line = f"{point.key:<30}"
        if record and status == "ok":
            line += f" {record.throughput:>12,.0f} {record.unit:<10} {record.peak_mem_bytes / GIB:6.2f} GiB  ok"
        else:
            line += f"  {status}: {brief(reason or '-')}"
        tqdm.write(line, file=sys.stdout)
        if status in ("crashed", "timeout") and log_path:
            tqdm.write(f"    log: {log_path}\n" + "".join(f"    | {t}\n" for t in _tail(log_path)).rstrip(),
                       file=sys.stdout)


def _tail(path: str, n: int = LOG_LINES) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return [line.rstrip("\n")[:200] for line in f.readlines()[-n:]]
