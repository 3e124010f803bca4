"""Change-point detection finds a planted shift in a synthetic history of 50 runs, and nothing in
an unchanged one."""

from __future__ import annotations

import numpy as np
import pytest

from bprof.ci.trend import change_points


def history(seed: int, shift_at: int | None, shift_frac: float, noise_frac: float = 0.03, n: int = 50) -> list[float]:
    rng = np.random.default_rng(seed)
    values = 100e6 * np.exp(rng.normal(0.0, noise_frac, n))
    if shift_at is not None:
        values[shift_at:] *= 1 + shift_frac
    return [float(v) for v in values]


@pytest.mark.parametrize("seed, at", [(1, 30), (2, 12), (3, 41)])
def test_a_planted_10_percent_shift_is_found_at_its_run(seed, at):
    [point] = change_points(history(seed, at, 0.10))
    assert point.index == at
    assert point.change_frac == pytest.approx(0.10, abs=0.03)
    assert point.p_value <= 0.01


def test_two_shifts_are_both_found():
    values = history(4, 20, 0.10)
    values[35:] = [v * 0.8 for v in values[35:]]
    assert [p.index for p in change_points(values)] == [20, 35]


def test_heavy_tailed_noise_without_a_shift_finds_nothing():
    rng = np.random.default_rng(5)
    values = [float(v) for v in 100e6 * np.exp(0.03 * rng.standard_t(2, 50))]
    assert change_points(values) == []
    assert change_points(history(6, None, 0.0)) == []
