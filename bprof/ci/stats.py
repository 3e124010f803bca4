"""The statistics of the CI gate, on plain lists of floats: robust outlier rules and the Student's t
prediction band a new run must fall in (the t distribution from scipy.stats).

Why these: the run is the unit of evidence (steps within a run are correlated, machines drift
between runs), so a candidate run is one new draw to compare with the n baseline runs. If the
baseline runs' log summaries are normal with unknown mean and variance, a new draw x satisfies
(x - mean) / (sd * sqrt(1 + 1/n)) ~ t(n - 1) exactly (the prediction interval); the band at
confidence c is mean +/- t_{(1+c)/2, n-1} * sd * sqrt(1 + 1/n).

Outliers are values whose modified z-score |x - median| / (1.4826 * MAD) exceeds 3.5 (Iglewicz &
Hoaglin). Within a run they are steps (the MAD floored at 1 % of the median); between runs they are
runs, judged on their log values with the MAD floored at 0.03 (3 %), at most a quarter of them left
out, the most extreme first. One cold-start run among five (32.8 ms against 19-22 ms) would otherwise set the band's width on its
own. The higher floor is because the MAD of five values is itself noisy: with a 1 % floor, one set in
five of normal runs with a 5 % spread loses a run and the 99 % band's false alarms rise to 2.4 %;
with 3 %, 0.9 % of such sets lose a run, false alarms stay at 1.2 %, and a run 1.6x the others is
still left out of 94 % of such sets of five and of all sets of ten (tests/ci/test_stats.py simulates it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median

from scipy import stats

MAD_TO_SIGMA = 1.4826  # 1.4826 * MAD estimates the sd of a normal sample
OUTLIER_Z = 3.5  # |modified z| above this is an outlier (Iglewicz & Hoaglin's rule)
MIN_MAD_FRAC = 0.01  # the MAD is floored at 1% of the median: regular steps are not outliers for 0.5%
RUN_OUTLIER_Z = OUTLIER_Z  # between runs, on log values, ...
RUN_MIN_MAD = 0.03  # ... the MAD floored at 0.03 in log units (3 %) ...
RUN_MAX_EXCLUDED_FRAC = 0.25  # ... and at most a quarter of the runs excluded


@dataclass(frozen=True)
class Kept:
    values: list[float]  # the values that are not outliers, in input order
    excluded: list[int]  # indexes of the outliers, in input order
    z_scores: list[float] = field(default_factory=list)  # signed modified z-score of every input value


def robust_keep(values: list[float], z: float = OUTLIER_Z, min_mad: float | None = None,
                max_excluded: int | None = None) -> Kept:
    """Drop values whose modified z-score |x - median| / (1.4826 * MAD) exceeds `z`.

    The MAD is floored at `min_mad` (default: MIN_MAD_FRAC of |median|) so that near-identical values
    do not turn a small wobble into an outlier. At most `max_excluded` values go, the largest |z|
    first (default: no limit). With fewer than 3 values nothing is excluded.
    """
    if len(values) < 3:
        return Kept(list(values), [])
    center = median(values)
    floor = MIN_MAD_FRAC * abs(center) if min_mad is None else min_mad
    mad = max(median(abs(v - center) for v in values), floor)
    if mad == 0:
        return Kept(list(values), [], [0.0] * len(values))
    scores = [(v - center) / (MAD_TO_SIGMA * mad) for v in values]
    flagged = sorted((i for i, s in enumerate(scores) if abs(s) > z), key=lambda i: (-abs(scores[i]), i))
    excluded = sorted(flagged if max_excluded is None else flagged[:max_excluded])
    return Kept([v for i, v in enumerate(values) if i not in excluded], excluded, scores)


def outlier_runs(log_values: list[float]) -> Kept:
    """The baseline runs kept for a band, from their log summaries (the rule in the module docstring)."""
    return robust_keep(log_values, RUN_OUTLIER_Z, RUN_MIN_MAD, int(RUN_MAX_EXCLUDED_FRAC * len(log_values)))


def spread_frac(values: list[float]) -> float | None:
    """Robust relative spread: 1.4826 * MAD / |median| (None for an empty list or a zero median)."""
    if not values:
        return None
    center = median(values)
    if center == 0:
        return None
    return MAD_TO_SIGMA * median(abs(v - center) for v in values) / abs(center)


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Sample mean and sample standard deviation (n - 1 denominator); needs two values. Equal values
    (a work metric of unchanged runs) have exactly their value as mean: summing would round it."""
    n = len(values)
    if min(values) == max(values):
        return values[0], 0.0
    mean = sum(values) / n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


@dataclass(frozen=True)
class Band:
    """Where a new run's log-summary is expected, from n baseline log-summaries."""

    center: float  # mean of the kept baseline values
    sd: float  # their sample sd
    num_runs: int  # baseline values kept
    t_crit: float  # t_{(1+confidence)/2, n-1}
    half_width: float  # t_crit * sd * sqrt(1 + 1/n)

    @property
    def width_frac(self) -> float:
        """How far the band reaches above its center, as a fraction of it (the log band is symmetric:
        exp(half_width) - 1 above, 1 - exp(-half_width) below, the smaller)."""
        return math.expm1(self.half_width)

    def t_score(self, x: float) -> float:
        """(x - center) / (sd * sqrt(1 + 1/n)); infinite when the baseline has no spread and x differs."""
        scale = self.sd * math.sqrt(1.0 + 1.0 / self.num_runs)
        if scale == 0:
            return 0.0 if x == self.center else math.copysign(math.inf, x - self.center)
        return (x - self.center) / scale

    def p_two_sided(self, x: float) -> float:
        """Probability that a run from the baseline's distribution lies at least this far from the center."""
        return float(2.0 * stats.t.sf(abs(self.t_score(x)), self.num_runs - 1))

    def outside(self, x: float) -> bool:
        return abs(self.t_score(x)) > self.t_crit


def prediction_band(values: list[float], confidence: float) -> Band:
    """The two-sided prediction band at `confidence` for one new value drawn like `values` (n >= 2)."""
    n = len(values)
    if n < 2:
        raise ValueError("a prediction band needs at least two values")
    center, sd = mean_sd(values)
    t_crit = float(stats.t.ppf((1.0 + confidence) / 2.0, n - 1))
    return Band(center, sd, n, t_crit, t_crit * sd * math.sqrt(1.0 + 1.0 / n))


def runs_for_width(sd: float, confidence: float, width_frac: float, max_runs: int = 100) -> int | None:
    """The fewest runs whose band at `confidence` reaches at most `width_frac` above its center if
    their log values spread by `sd`; None when even `max_runs` would not."""
    target = math.log1p(width_frac)
    for n in range(2, max_runs + 1):
        if stats.t.ppf((1.0 + confidence) / 2.0, n - 1) * sd * math.sqrt(1.0 + 1.0 / n) <= target:
            return n
    return None
