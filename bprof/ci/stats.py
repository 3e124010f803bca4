"""The statistics of the CI gate, on plain lists of floats: robust outlier rules, Student's t and the
prediction band a new run must fall in. No store, no numpy needed.

Why these: the run is the unit of evidence (steps within a run are correlated, machines drift
between runs), so a candidate run is one new draw to compare with the n baseline runs. If the
baseline runs' log summaries are normal with unknown mean and variance, a new draw x satisfies
(x - mean) / (sd * sqrt(1 + 1/n)) ~ t(n - 1) exactly (the prediction interval); the band at
confidence c is mean +/- t_{(1+c)/2, n-1} * sd * sqrt(1 + 1/n). Within a run, outlier steps are
excluded by the modified z-score (Iglewicz & Hoaglin); between runs nothing is excluded: a slow
baseline run is noise the candidate may meet too, and the plain sd keeps it in the band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

MAD_TO_SIGMA = 1.4826  # 1.4826 * MAD estimates the sd of a normal sample
OUTLIER_Z = 3.5  # |modified z| above this is an outlier (Iglewicz & Hoaglin's rule)
MIN_MAD_FRAC = 0.01  # the MAD is floored at 1% of the median: regular steps are not outliers for 0.5%


@dataclass(frozen=True)
class Kept:
    values: list[float]  # the values that are not outliers, in input order
    excluded: list[int]  # indexes of the outliers


def robust_keep(values: list[float], z: float = OUTLIER_Z, min_mad: float | None = None) -> Kept:
    """Drop values whose modified z-score |x - median| / (1.4826 * MAD) exceeds `z`.

    The MAD is floored at `min_mad` (default: MIN_MAD_FRAC of |median|) so that near-identical values
    do not turn a small wobble into an outlier. With fewer than 3 values nothing is excluded.
    """
    if len(values) < 3:
        return Kept(list(values), [])
    center = median(values)
    floor = MIN_MAD_FRAC * abs(center) if min_mad is None else min_mad
    mad = max(median(abs(v - center) for v in values), floor)
    if mad == 0:
        return Kept(list(values), [])
    excluded = [i for i, v in enumerate(values) if abs(v - center) / (MAD_TO_SIGMA * mad) > z]
    return Kept([v for i, v in enumerate(values) if i not in excluded], excluded)


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


# ---- Student's t, via the regularised incomplete beta function (Numerical Recipes' continued fraction)

def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on t_cdf (monotone; 200 halvings reach float precision)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class Band:
    """Where a new run's log-summary is expected, from n baseline log-summaries."""

    center: float  # mean of the kept baseline values
    sd: float  # their sample sd
    num_runs: int  # baseline values kept
    t_crit: float  # t_{(1+confidence)/2, n-1}
    half_width: float  # t_crit * sd * sqrt(1 + 1/n)

    def t_score(self, x: float) -> float:
        """(x - center) / (sd * sqrt(1 + 1/n)); infinite when the baseline has no spread and x differs."""
        scale = self.sd * math.sqrt(1.0 + 1.0 / self.num_runs)
        if scale == 0:
            return 0.0 if x == self.center else math.copysign(math.inf, x - self.center)
        return (x - self.center) / scale

    def p_two_sided(self, x: float) -> float:
        """Probability that a run from the baseline's distribution lies at least this far from the center."""
        return 2.0 * (1.0 - t_cdf(abs(self.t_score(x)), self.num_runs - 1))

    def outside(self, x: float) -> bool:
        return abs(self.t_score(x)) > self.t_crit


def prediction_band(values: list[float], confidence: float) -> Band:
    """The two-sided prediction band at `confidence` for one new value drawn like `values` (n >= 2)."""
    n = len(values)
    if n < 2:
        raise ValueError("a prediction band needs at least two values")
    center, sd = mean_sd(values)
    t_crit = t_quantile((1.0 + confidence) / 2.0, n - 1)
    return Band(center, sd, n, t_crit, t_crit * sd * math.sqrt(1.0 + 1.0 / n))
