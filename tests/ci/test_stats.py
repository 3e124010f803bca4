"""The statistics the gate rests on, against published values, hand-worked cases and a seeded
simulation of unchanged runs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bprof.ci.stats import outlier_runs, prediction_band, robust_keep, runs_for_width, spread_frac


@pytest.mark.parametrize("confidence, n, table", [
    (0.95, 2, 12.706), (0.95, 5, 2.776), (0.95, 10, 2.262), (0.99, 5, 4.604), (0.99, 10, 3.250),
    (0.99, 31, 2.750), (0.90, 3, 2.920),
])
def test_the_bands_t_factor_matches_the_published_table(confidence, n, table):
    # t_{(1+c)/2, n-1} of a t table (df = n - 1)
    band = prediction_band([float(i % 3) for i in range(n)], confidence)
    assert band.t_crit == pytest.approx(table, abs=5e-4)


def test_outlier_steps_are_excluded_by_the_modified_z_score():
    # a checkpoint step 3x the others; 1% wobble is kept
    kept = robust_keep([100.0, 101.0, 99.0, 300.0, 100.5])
    assert kept.excluded == [3] and kept.values == [100.0, 101.0, 99.0, 100.5]
    assert kept.z_scores[3] == pytest.approx(199.5 / (1.4826 * 1.005))  # the MAD is floored at 1% of 100.5
    # the MAD floor (1% of the median): near-identical steps do not make a 2% step an outlier
    assert robust_keep([100.0, 100.0, 100.0, 102.0]).excluded == []
    # fewer than 3 values: no majority, nothing excluded
    assert robust_keep([1.0, 100.0]).excluded == []
    assert spread_frac([100.0, 110.0, 90.0]) == pytest.approx(1.4826 * 10 / 100)
    # at most max_excluded values go, the most extreme first
    assert robust_keep([100.0, 100.5, 99.5, 150.0, 300.0], max_excluded=1).excluded == [4]


def test_a_cold_start_baseline_run_is_left_out_and_a_noisy_one_is_not():
    # what the issue saw: a cold first run at 32.8 ms among runs at 19-22 ms
    ms = [32.8, 19.4, 20.9, 22.6, 21.3]
    kept = outlier_runs([math.log(v) for v in ms])
    assert kept.excluded == [0] and kept.z_scores[0] > 3.5
    # a fast one the same way
    assert outlier_runs([math.log(v) for v in [21.0, 20.5, 12.0, 21.7, 20.1]]).excluded == [2]
    # 10% between runs is noise, not an outlier (the floor: MAD at least 0.03 in log units)
    assert outlier_runs([math.log(v) for v in [20.0, 20.0, 20.1, 20.0, 22.0]]).excluded == []
    # two slow runs of five are not "one outlier": a quarter at most goes, the slower one
    kept = outlier_runs([math.log(v) for v in [20.0, 20.3, 19.8, 30.0, 33.0]])
    assert kept.excluded == [4]
    # ten runs: two may go
    assert outlier_runs([math.log(v) for v in [20.0, 20.3, 19.8, 20.1, 40.0, 19.9, 20.2, 9.0, 20.0, 20.4]]).excluded == [4, 7]


def test_leaving_out_outlier_runs_keeps_the_false_alarm_rate_near_nominal():
    # seeded: 4000 sets of 5 unchanged baseline runs with a 5% spread (normal log values) and one
    # unchanged candidate each; a 99% band must call about 1% of candidates outside it. The steps'
    # MAD floor (1%) would lose a run in 18% of the sets and call 2.4%.
    rng = np.random.default_rng(20)
    outside = excluded = 0
    num_sets = 4000
    for _ in range(num_sets):
        logs = list(rng.normal(0.0, 0.05, 5))
        kept = outlier_runs(logs)
        excluded += bool(kept.excluded)
        outside += prediction_band(kept.values, 0.99).outside(float(rng.normal(0.0, 0.05)))
    assert excluded / num_sets < 0.02
    assert outside / num_sets < 0.016


def test_prediction_band_is_the_t_interval_for_one_new_draw():
    values = [0.0, 1.0, 2.0, 3.0, 4.0]
    band = prediction_band(values, 0.95)
    sd = math.sqrt(2.5)
    assert band.center == 2.0 and band.sd == pytest.approx(sd)
    assert band.half_width == pytest.approx(2.776445 * sd * math.sqrt(1.2), rel=1e-5)
    assert band.width_frac == pytest.approx(math.exp(band.half_width) - 1)
    assert not band.outside(2.0 + band.half_width * 0.99) and band.outside(2.0 + band.half_width * 1.01)
    assert band.p_two_sided(2.0 + band.half_width) == pytest.approx(0.05, abs=1e-9)
    assert band.p_two_sided(2.0) == pytest.approx(1.0)
    flat = prediction_band([5.0, 5.0, 5.0], 0.99)
    assert flat.outside(5.1) and not flat.outside(5.0) and flat.p_two_sided(5.1) == 0.0


def test_runs_for_width_is_the_fewest_runs_whose_band_fits():
    # sd 5% at 99%: t_{.995,n-1} * 0.05 * sqrt(1 + 1/n) <= log(1.25) first at n = 6
    n = runs_for_width(0.05, 0.99, 0.25)
    assert n == 6
    assert prediction_band(list(np.linspace(-1, 1, n) * 0.05 / np.std(np.linspace(-1, 1, n), ddof=1)),
                           0.99).width_frac <= 0.25
    assert prediction_band(list(np.linspace(-1, 1, n - 1) * 0.05 / np.std(np.linspace(-1, 1, n - 1), ddof=1)),
                           0.99).width_frac > 0.25
    # a spread no number of runs brings within the limit: 2.576 * 0.1 > log(1.25)
    assert runs_for_width(0.10, 0.99, 0.25) is None
