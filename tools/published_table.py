"""Print the published-runs table of docs/plan.md from ``ds_bench.perf.published``: each run's hardware, model,
layout, published and predicted throughput (and step time), their ratio, the largest fit or memory, its source;
then the achieved constants and the runs that set them.

    python tools/published_table.py     # then paste it over the page's table
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's ds_bench, not an installed one

from ds_bench.perf import published  # noqa: E402
from ds_bench.perf.devices import DEVICES  # noqa: E402


def rows() -> list[str]:
    out = ["| run | hardware | model | layout | published | predicted (out of sample) | ratio | fit / memory | source |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in published.table():
        pub, pred = f"{r['published']:,.1f} tok/s/GPU", f"{r['predicted']:,.1f}"
        if "published_ms" in r:
            pub += f" ({r['published_ms']:,.1f} ms)"
            pred += f" ({r['predicted_ms']:,.1f} ms)"
        out.append(f"| {r['id']} | {r['hardware']} | {r['model']} | {r['layout']} | {pub} | {pred} | "
                   f"{r['ratio']:.2f} | {r.get('fit', '')} | {r['source']} |")
    return out


def constants() -> list[str]:
    out = ["| family | achieved (perf.devices) | fitted median | runs that set it |", "| --- | --- | --- | --- |"]
    for family, (fitted, ids) in published.fitted_achieved().items():
        out.append(f"| {family} | {DEVICES[family.lower()].achieved} | {fitted:.3f} | {', '.join(ids)} |")
    return out


if __name__ == "__main__":
    with contextlib.redirect_stdout(sys.stderr):  # DeepSpeed's estimators log their accelerator line to stdout
        tables = ["\n".join(rows()), "\n".join(constants())]
    print("\n\n".join(tables))
