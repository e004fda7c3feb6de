"""Correctness beside speed: whether two runs of the same layout and seed trained the same way, step by step (pure).

``ds-bench compare`` sets each match's loss and gradient-norm curves (``RunMetrics.loss_curve``,
``grad_norm_curve``: every step, warm-up included) side by side and calls a step that differs beyond the layout's
parity tolerance (``PARITY_RTOL``, by precision). Same layout, same seed, same data: two DeepSpeed or PyTorch releases that
are both right give the same curves to rounding (measured: ZeRO-2 on deepspeed 0.18.4 and 0.19.8, fp32, every
loss and norm equal to 6 digits), so a difference is a change of numerics to look at, or a bug: DeepSpeed #7718
(ZeRO-2 with gradient accumulation on 0.17.6-0.18.2) kept the first losses and reported gradient norms a third to
a half too small, and its losses parted from the second step.
"""

from __future__ import annotations

from dataclasses import dataclass

PARITY_RTOL = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
"""Relative difference per step within which two runs of one layout count as the same, by precision: fp32 runs
of one layout agree to the records' 6 digits across releases, reordered reductions move the 5th-6th digit
(the parallel degrees' parity tests hold 1e-5); bf16 keeps 8 bits of mantissa (2^-8 = 4e-3 per rounding), so a
different kernel order moves a loss by up to ~1e-2."""


CURVES = (("loss_curve", "loss"), ("grad_norm_curve", "gradient norm"))
"""The per-step curves a run records (``RunMetrics``) and a sweep point carries (``SweepPointRecord``), by the
field name both give them, and how a difference names each."""


def curves_of(source) -> dict[str, list]:
    """A run's metrics' or a sweep point's ``CURVES``, each an empty list where it recorded none."""
    return {name: getattr(source, name) or [] for name, _ in CURVES}


@dataclass(frozen=True)
class CurveCheck:
    same: bool
    said: str
    """``same curves (20 steps)``, or the first step that differs: ``loss differs from step 2: 2.340258 vs
    2.344264``."""


def check(base: dict[str, list], new: dict[str, list], precision: str) -> CurveCheck | None:
    """Whether the curves of ``new`` stay within ``PARITY_RTOL[precision]`` of ``base``'s at every step both hold,
    naming the first step each curve parts at (the earliest first); None when the two share no curve (a record
    without them)."""
    rtol = PARITY_RTOL.get(precision, PARITY_RTOL["bf16"])
    parted, compared = [], 0
    for name, words in CURVES:
        a, b = base.get(name) or [], new.get(name) or []
        compared = max(compared, min(len(a), len(b)))
        step = first_difference(a, b, rtol)
        if step is not None:
            parted.append((step, f"{words} differs from step {step}: {a[step - 1]:.6g} vs {b[step - 1]:.6g}"))
    if parted:
        return CurveCheck(False, "; ".join(said for _, said in sorted(parted)))
    return CurveCheck(True, f"same curves ({compared} steps)") if compared else None


def first_difference(a: list, b: list, rtol: float) -> int | None:
    """The first step (from 1) where ``a`` and ``b`` differ by more than ``rtol`` of the larger; steps either
    lacks (None: the engine computed no norm) are passed over."""
    for step, (x, y) in enumerate(zip(a, b), start=1):
        if x is not None and y is not None and abs(y - x) > rtol * max(abs(x), abs(y), 1e-12):
            return step
    return None
