"""Print the legality table of docs/engines-and-layouts.md from ``ds_bench.config.legality.rules()``: one row per
rule, its example's key (and run options), the sentence said for it on 2 ranks, and its source.

    python tools/legality_table.py     # then paste it over the page's table

``tests/test_legality.py::test_the_docs_list_every_rule`` fails while the page's table differs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's ds_bench, not an installed one

from ds_bench.config.legality import Where, rules  # noqa: E402

WORLD = 2


def rows() -> list[str]:
    out = ["| rule | refused | source |", "| --- | --- | --- |"]
    for rule in rules():
        options = "".join(f" + {o}" for o in sorted(rule.example_options))
        said = rule.says(rule.example, Where(WORLD, "cpu", rule.example_options))
        out.append(f"| {rule.name} | e.g. `{rule.example.key}`{options}: {said} | {rule.source} |")
    return out


if __name__ == "__main__":
    print("\n".join(rows()))
