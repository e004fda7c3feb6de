"""The comm-bound verdict as the run summary says it: one sentence for a run record's ``comm_bound`` entry (the
entry itself, bus bytes, busbw and the bound, is ``perf.comm_bound``'s).
"""

from __future__ import annotations

from ds_bench.report.numbers import number


def describe(entry: dict) -> str:
    """The summary's text for a ``comm_bound`` entry."""
    if "note" in entry:
        return entry["note"]
    moved = " + ".join(f"{c} {number(v / 1e6, 3)} MB" for c, v in entry["bus_bytes_per_step"].items())
    rates = entry["busbw_GBps"]
    bw = (f"{number(next(iter(rates.values())), 3)} GB/s" if len(set(rates.values())) == 1
          else ", ".join(f"{c} {number(v, 3)} GB/s" for c, v in rates.items()))
    verdict = "communication-bound" if entry["communication_bound"] else "not communication-bound"
    return (f">= {number(entry['comm_ms_lower_bound'], 3)} ms of the {number(entry['step_ms_median'], 3)} ms step "
            f"({entry['fraction_of_step']:.0%}): {moved} per rank at busbw {bw} ({entry['busbw_source']}); "
            f"{verdict}")
