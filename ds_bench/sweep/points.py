"""The sweep's points: one configuration each (ZeRO stage, offload, precision, micro-batch,
gradient accumulation), as pure values with a stable text key. The key names a point in records,
log files and tables, and is what a resumed sweep matches finished points on.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass

OFFLOADS = ("none", "optimizer", "all")
"""``optimizer``: ``offload_optimizer`` to CPU (ZeRO-Offload); ``all``: optimizer and parameters
(ZeRO-Infinity to CPU memory, stage 3 only)."""
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True, order=True)
class Point:
    stage: int
    offload: str
    precision: str
    micro_batch: int
    grad_accum: int = 1

    @property
    def key(self) -> str:
        return (f"z{self.stage} off={self.offload} {self.precision} mbs={self.micro_batch}"
                + (f" ga={self.grad_accum}" if self.grad_accum != 1 else ""))

    @property
    def family(self) -> tuple[int, str, str, int]:
        """Every point that differs only in micro-batch: one line of the throughput plot and one
        ``--micro-batch auto`` search."""
        return (self.stage, self.offload, self.precision, self.grad_accum)

    def family_label(self) -> str:
        return f"z{self.stage} off={self.offload} {self.precision}" + (
            f" ga={self.grad_accum}" if self.grad_accum != 1 else "")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Point:
        return cls(int(d["stage"]), str(d["offload"]), str(d["precision"]), int(d["micro_batch"]),
                   int(d.get("grad_accum", 1)))

    def with_micro_batch(self, micro_batch: int) -> Point:
        return Point(self.stage, self.offload, self.precision, micro_batch, self.grad_accum)


def parse_key(text: str, defaults: Point) -> Point:
    """``z2 off=optimizer fp32 mbs=128 ga=4`` (any part left out: ``defaults``'s) -> Point (pure).
    Raises ValueError naming the part it does not understand."""
    fields = defaults.to_dict()
    for part in text.split():
        name, _, value = part.partition("=")
        if not value and part[:1] == "z" and part[1:].isdigit() and int(part[1:]) in range(4):
            fields["stage"] = int(part[1:])
        elif not value and part in PRECISIONS:
            fields["precision"] = part
        elif name == "off" and value in OFFLOADS:
            fields["offload"] = value
        elif name in ("mbs", "ga") and value.isdigit() and int(value) > 0:
            fields["micro_batch" if name == "mbs" else "grad_accum"] = int(value)
        else:
            raise ValueError(f"{part!r} is not z0..z3, off={'|'.join(OFFLOADS)}, {'|'.join(PRECISIONS)}, "
                             "mbs=N or ga=N")
    if fields["micro_batch"] < 1:
        raise ValueError("a point needs a micro-batch: mbs=N")
    return Point.from_dict(fields)


def families(stages, offloads, precisions, grad_accums) -> list[Point]:
    """One point per family (micro-batch 0, a placeholder), in axis order."""
    return [Point(s, o, p, 0, g) for s, o, p, g in itertools.product(stages, offloads, precisions, grad_accums)]


def grid(stages, offloads, precisions, micro_batches, grad_accums) -> list[Point]:
    """The full grid for explicit micro-batches, family by family, micro-batches ascending."""
    return [f.with_micro_batch(m) for f in families(stages, offloads, precisions, grad_accums)
            for m in sorted(micro_batches)]


def invalid_reason(point: Point, device_type: str) -> str | None:
    """Why DeepSpeed cannot run this combination, or None. ``ds_config.prepare`` is the full check;
    these are the combinations a grid produces by construction, named in the sweep's own terms."""
    if point.offload != "none" and point.stage == 0:
        return "offload needs ZeRO stage 1, 2 or 3"
    if point.offload == "all" and point.stage != 3:
        return "parameter offload needs ZeRO stage 3"
    if point.precision == "fp16" and device_type == "cpu":
        return "fp16 needs a GPU (DeepSpeed's CPU accelerator has no fp16)"
    return None


def next_auto_micro_batch(results: dict[int, str], limit: int) -> int | None:
    """``--micro-batch auto`` for one family: the next micro-batch to try, or None when the search
    is over. ``results`` maps each micro-batch tried to ``fits`` or ``oom`` (anything that did not
    fit, including predicted not to fit). Doubling from 1 until the first oom (or ``limit``), then
    bisecting between the largest that fit and the smallest that did not (pure)."""
    if not results:
        return 1
    fits = [m for m, r in results.items() if r == "fits"]
    too_big = [m for m, r in results.items() if r != "fits"]
    largest_fit = max(fits, default=0)
    smallest_oom = min(too_big, default=None)
    if smallest_oom is None:
        nxt = largest_fit * 2
        return nxt if nxt <= limit else None
    if smallest_oom <= largest_fit + 1:
        return None
    return (largest_fit + smallest_oom) // 2 if largest_fit else (1 if 1 not in results else None)
