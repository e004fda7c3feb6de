"""How every report table writes a measured number (text and HTML alike): ``number``.

Thousands separators, a few significant digits, never scientific notation for the magnitudes a benchmark
measures: ``11,760`` ms, ``8,212`` ms, ``331.2`` tokens/s, ``0.0348`` TFLOP/s. Digits that are not
significant are not invented: past ``digits`` integer digits the number is rounded to a whole one
(``11,760``, not ``11,760.0``); below, trailing zeros go as ``:g`` drops them (``1.5``).
"""

from __future__ import annotations

import math

PLAIN_BELOW = 1e15
PLAIN_FROM = 1e-5
"""Magnitudes written in plain digits (down to a CPU's TFLOP/s, 0.0008); a number outside them (a stray 1e-7, an
overflow) in scientific notation."""


def number(value: float | int | None, digits: int = 4) -> str:
    """``value`` with ``digits`` significant digits (more when its integer part is longer), thousands separated;
    ``-`` when unknown."""
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    size = abs(value)
    if not PLAIN_FROM <= size < PLAIN_BELOW:
        return f"{value:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(size)))
    text = f"{value:,.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def ms(seconds: float | None, digits: int = 4) -> str:
    """Seconds written as milliseconds (``number``)."""
    return number(None if seconds is None else seconds * 1e3, digits)
