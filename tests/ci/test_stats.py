"""The statistics the gate rests on, against published values and hand-worked cases."""

from __future__ import annotations

import math

import pytest

from bprof.ci.stats import prediction_band, robust_keep, spread_frac, t_cdf, t_quantile


@pytest.mark.parametrize("p, df, table", [
    (0.975, 1, 12.706), (0.975, 4, 2.776), (0.975, 9, 2.262), (0.995, 4, 4.604), (0.995, 9, 3.250),
    (0.995, 30, 2.750), (0.95, 2, 2.920),
])
def test_t_quantiles_match_the_published_table(p, df, table):
    assert t_quantile(p, df) == pytest.approx(table, abs=5e-4)
    assert t_cdf(t_quantile(p, df), df) == pytest.approx(p, abs=1e-9)


def test_t_cdf_is_symmetric_and_tends_to_the_normal():
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(-1.5, 7) == pytest.approx(1 - t_cdf(1.5, 7))
    assert t_cdf(1.959964, 100000) == pytest.approx(0.975, abs=1e-5)


def test_outlier_steps_are_excluded_by_the_modified_z_score():
    # a checkpoint step 3x the others; 1% wobble is kept
    kept = robust_keep([100.0, 101.0, 99.0, 300.0, 100.5])
    assert kept.excluded == [3] and kept.values == [100.0, 101.0, 99.0, 100.5]
    # the MAD floor (1% of the median): near-identical steps do not make a 2% step an outlier
    assert robust_keep([100.0, 100.0, 100.0, 102.0]).excluded == []
    # fewer than 3 values: no majority, nothing excluded
    assert robust_keep([1.0, 100.0]).excluded == []
    assert spread_frac([100.0, 110.0, 90.0]) == pytest.approx(1.4826 * 10 / 100)


def test_prediction_band_is_the_t_interval_for_one_new_draw():
    values = [0.0, 1.0, 2.0, 3.0, 4.0]
    band = prediction_band(values, 0.95)
    sd = math.sqrt(2.5)
    assert band.center == 2.0 and band.sd == pytest.approx(sd)
    assert band.half_width == pytest.approx(2.776445 * sd * math.sqrt(1.2), rel=1e-5)
    assert not band.outside(2.0 + band.half_width * 0.99) and band.outside(2.0 + band.half_width * 1.01)
    assert band.p_two_sided(2.0 + band.half_width) == pytest.approx(0.05, abs=1e-6)
    flat = prediction_band([5.0, 5.0, 5.0], 0.99)
    assert flat.outside(5.1) and not flat.outside(5.0)
