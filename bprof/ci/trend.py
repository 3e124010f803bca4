"""Where in a series did a metric shift? E-divisive change-point detection (Matteson & James, 2014,
as Apache Otava/Hunter and MongoDB's CI use it) with a permutation test, on the log of the per-run
summaries.

Algorithm: for a segment x[0:n], every split tau (each side at least `min_size` runs) scores the
energy distance between x[:tau] and x[tau:]:
    Q(tau) = tau (n - tau) / n * (2 E|a - b| - E|a - a'| - E|b - b'|)
(E over pairs across and within the sides; |.| is the absolute difference, alpha = 1). The best
split's significance is the share of `permutations` random reorderings of the segment whose best
Q is at least as large ((hits + 1) / (permutations + 1)). A significant split is kept and both
sides are searched again (binary segmentation), until no split is significant. Seeded, so the
same history gives the same answer.

Ours, not a library's: MongoDB's signal-processing-algorithms 2.1.6 requires numpy < 2, and Apache
Otava 0.8.0 pins numpy 2.2.0 and scipy < 1.17 (and brings BigQuery, Postgres and Slack clients), so
neither installs beside bprof's other dependencies without downgrading them. On the histories of
tests/ci/test_trend.py the E-divisive of both (signal-processing-algorithms' e_divisive, Otava's
compute_change_points_orig) found exactly the change points this module finds; Otava's default,
windowed Hunter variant found two more in two of the single-shift histories.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import median

import numpy as np

DEFAULT_PERMUTATIONS = 199
MIN_SEGMENT_RUNS = 3


@dataclass(frozen=True)
class ChangePoint:
    index: int  # first run after the shift (0-based position in the series)
    p_value: float  # permutation test of the split
    before_median: float  # median of the segment's runs before the shift (original units)
    after_median: float  # ... and after it, up to the next change point
    change_frac: float  # after_median / before_median - 1


def _best_split(x: np.ndarray, min_size: int) -> tuple[int, float]:
    """(tau, Q(tau)) maximising the energy statistic over splits with min_size runs each side."""
    n = len(x)
    d = np.abs(x[:, None] - x[None, :])
    # prefix sums over the distance matrix give every split's three means in O(n^2) total
    csum = d.cumsum(0).cumsum(1)

    def block(r0: int, r1: int, c0: int, c1: int) -> float:  # sum of d[r0:r1, c0:c1]
        total = csum[r1 - 1, c1 - 1]
        if r0:
            total -= csum[r0 - 1, c1 - 1]
        if c0:
            total -= csum[r1 - 1, c0 - 1]
        if r0 and c0:
            total += csum[r0 - 1, c0 - 1]
        return total

    best_tau, best_q = -1, -math.inf
    for tau in range(min_size, n - min_size + 1):
        m, k = tau, n - tau
        across = block(0, tau, tau, n) / (m * k)
        within_a = block(0, tau, 0, tau) / (m * (m - 1)) if m > 1 else 0.0
        within_b = block(tau, n, tau, n) / (k * (k - 1)) if k > 1 else 0.0
        q = m * k / n * (2 * across - within_a - within_b)
        if q > best_q:
            best_tau, best_q = tau, q
    return best_tau, best_q


def change_points(values: list[float], confidence: float = 0.99, permutations: int = DEFAULT_PERMUTATIONS,
                  min_size: int = MIN_SEGMENT_RUNS, seed: int = 0) -> list[ChangePoint]:
    """Change points of a series of positive per-run values, oldest first; significant at `confidence`."""
    x = np.log(np.asarray(values, dtype=float))
    rng = np.random.default_rng(seed)
    alpha = 1.0 - confidence
    found: list[tuple[int, float]] = []
    segments = [(0, len(x))]
    while segments:
        start, end = segments.pop()
        if end - start < 2 * min_size:
            continue
        seg = x[start:end]
        tau, q = _best_split(seg, min_size)
        hits = sum(_best_split(rng.permutation(seg), min_size)[1] >= q for _ in range(permutations))
        p = (hits + 1) / (permutations + 1)
        if p <= alpha:
            found.append((start + tau, p))
            segments += [(start, start + tau), (start + tau, end)]
    found.sort()
    bounds = [0] + [i for i, _ in found] + [len(values)]
    out = []
    for k, (index, p) in enumerate(found):
        before = median(values[bounds[k]:index])
        after = median(values[index:bounds[k + 2]])
        out.append(ChangePoint(index, float(p), float(before), float(after), float(after / before - 1.0)))
    return out
