"""Every match of two sides judged (pure): its speed verdict (``compare_verdict``) and its curves checked
(``compare_curves``), worst change first, with the one-line summary; what ``ds-bench compare`` prints and what the
HTML report's stacks section shows (``html_verdicts``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ds_bench.report.compare_curves import CurveCheck, check
from ds_bench.report.compare_match import Sample
from ds_bench.report.compare_verdict import DEFAULT_ALPHA, DEFAULT_THRESHOLD_PCT, Verdict, judge

Judged = tuple[Sample, Sample, Verdict, CurveCheck | None]


@dataclass(frozen=True)
class Judgement:
    judged: list[Judged]
    """One per match, worst change first."""
    only_base: int
    only_new: int
    threshold_pct: float
    alpha: float

    @property
    def slower(self) -> int:
        return sum(v.regression for _, _, v, _ in self.judged)

    @property
    def differ(self) -> int:
        """Matches whose losses or gradient norms differ beyond their parity tolerance."""
        return sum(c is not None and not c.same for _, _, _, c in self.judged)

    def summary(self) -> str:
        return (f"{len(self.judged)} match(es), {self.slower} slower (threshold {self.threshold_pct:g}%, alpha "
                f"{self.alpha:g}), {self.differ} with different losses or gradient norms; only in BASE: "
                f"{self.only_base}, only in NEW: {self.only_new}")


def judge_all(base: dict[tuple, Sample], new: dict[tuple, Sample], threshold_pct: float = DEFAULT_THRESHOLD_PCT,
              alpha: float = DEFAULT_ALPHA) -> Judgement:
    """Each key both sides hold, judged; an empty ``judged`` when they share none."""
    matched = [key for key in base if key in new]
    judged = [(base[k], new[k], judge(base[k].values, new[k].values, base[k].higher_is_better, threshold_pct, alpha),
               check(base[k].curves, new[k].curves, base[k].precision)) for k in matched]
    judged.sort(key=lambda item: item[2].change_pct)
    return Judgement(judged, len(base) - len(matched), len(new) - len(matched), threshold_pct, alpha)
