"""What the capacity reports say beside their rows (text and HTML alike): the search's bound (its probes that
ran out of memory, which found the limit and are no failure), which runs those probes were, and the note for a
resident peak above the cap (``--cpu-mem-limit`` is an rlimit on private data, ``machine.memory``, so a rank's
RSS, which also counts file pages, can read above it and still be ok)."""

from __future__ import annotations

from ds_bench.record.schema import CapacityProbeRecord, Record, RunRecord

PROBE_TAG_PREFIX = "capacity-"
"""How a capacity probe's run is tagged (``capacity.driver``: ``capacity-<search id>-<layout and member>-...``)."""

ABOVE_CAP = "*"
ABOVE_CAP_NOTE = (f"{ABOVE_CAP} resident peak above the cap: --cpu-mem-limit is an rlimit on a rank's private data "
                  "(RLIMIT_DATA), not on its resident memory, which also counts the libraries' file pages; the probe "
                  "ran within the cap")


def above_cap(peak: int | None, cap: int | None) -> bool:
    return bool(peak and cap and peak > cap)


def peak_text(peak: int | None, cap: int | None = None) -> str:
    """``1.13 / 1.10 *``: GiB per rank, the peak beside the cap when given, marked when the peak is above it."""
    if not peak:
        return "-"
    text = f"{peak / 2**30:.2f}" + (f" / {cap / 2**30:.2f}" if cap else "")
    return f"{text} {ABOVE_CAP}" if above_cap(peak, cap) else text


def member_text(probe: CapacityProbeRecord) -> str:
    """``16 x 384 x 6 (48.1M)``, or for a sequence length ``4,096 tokens``."""
    if probe.member.startswith("seq ") and probe.seq_len:
        return f"{probe.seq_len:,} tokens"
    return f"{probe.member} ({probe.params / 1e6:.1f}M)" if probe.params else probe.member


def bound_lines(probes: list[CapacityProbeRecord]) -> list[str]:
    """Per search and layout that hit the limit: ``z0 off=none fp32 mbs=1: probes over the limit: 2, first oom at
    16 x 384 x 6 (48.1M)``, the smallest member that ran out of memory."""
    over: dict[tuple[str, str], list[CapacityProbeRecord]] = {}
    for p in probes:
        if p.status == "oom":
            over.setdefault((p.capacity, p.layout), []).append(p)
    return [f"{layout}: probes over the limit: {len(found)}, first oom at {member_text(min(found, key=lambda p: p.index))}"
            for (_, layout), found in over.items()]


def expected_oom_runs(records: list[Record]) -> set[str]:
    """The run ids of the runs that were capacity probes ending out of memory: the probes' own (with every rank's
    record of them, a rank torchrun ended included), and where no probe record is at hand, runs tagged as a
    probe's whose failure was out of memory."""
    ids = {r.run_id for r in records if isinstance(r, CapacityProbeRecord) and r.status == "oom" and r.run_id}
    ids |= {r.run_id for r in records if isinstance(r, RunRecord) and r.run_id and (r.tag or "").startswith(
        PROBE_TAG_PREFIX) and r.failure is not None and r.failure.kind == "oom"}
    return ids
