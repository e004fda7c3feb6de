"""Whether a measurement changed between two results files, with noise respected (pure).

Per match: the change of the medians, 100 (new - base) / base %, signed so that negative is worse (for a
metric where higher is better, slower). The verdict:
- both sides with 3 or more values: the exact one-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``,
  Mann and Whitney 1947; no assumption of normality, robust to an outlier step or run) of "new is worse
  than base" and of "new is better"; ``slower`` only when that test gives p <= ``alpha`` (default 0.05)
  *and* the change is beyond ``threshold_pct`` (default 5%): a significant 1% shift is not a regression,
  nor is a 20% difference between two overlapping samples. With 3 values a side the smallest one-sided p
  is 1/20 = 0.05 (every new value below every base value): 3 repeats are the least that can decide at 5%;
- fewer values on either side: a single-sample comparison, said so (``single sample``): ``slower`` when the
  change is beyond the threshold, since nothing better is known (exit 1 as a regression, the table saying
  it rests on one sample).
``same`` otherwise; ``faster`` symmetrically.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

MIN_REPEATS = 3
DEFAULT_THRESHOLD_PCT = 5.0
DEFAULT_ALPHA = 0.05


@dataclass(frozen=True)
class Verdict:
    base_median: float
    new_median: float
    change_pct: float
    """100 (new - base) / base, negative when worse (for a lower-is-better metric the sign is turned)."""
    p_value: float | None
    """The one-sided Mann-Whitney U p of the direction the medians moved; None for a single sample."""
    verdict: str
    """``slower``, ``faster`` or ``same``."""
    single_sample: bool

    @property
    def regression(self) -> bool:
        return self.verdict == "slower"


def judge(base: list[float], new: list[float], higher_is_better: bool = True,
          threshold_pct: float = DEFAULT_THRESHOLD_PCT, alpha: float = DEFAULT_ALPHA) -> Verdict:
    base_median, new_median = statistics.median(base), statistics.median(new)
    change = 100.0 * (new_median - base_median) / base_median
    signed = change if higher_is_better else -change
    moved = ("faster" if signed > 0 else "slower") if abs(change) > threshold_pct else "same"
    if min(len(base), len(new)) < MIN_REPEATS:
        return Verdict(base_median, new_median, signed, None, moved, True)
    p = _one_sided_p(base, new, new_is_lower=new_median < base_median)
    return Verdict(base_median, new_median, signed, p, moved if p <= alpha else "same", False)


def _one_sided_p(base: list[float], new: list[float], new_is_lower: bool) -> float:
    """p of "new is shifted the way the medians moved" (exact for small samples without ties)."""
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(new, base, alternative="less" if new_is_lower else "greater", method="auto").pvalue)
