"""A what-if never prints a number that breaks a physical invariant: a predicted step of zero or less
is withheld with the reason, and an unchanged replay that misses the measurement stops all predictions."""

import numpy as np
import pytest

from bprof.errors import DataError
from bprof.whatif.run import ScenarioResult, _check_unchanged


def _result(predicted, measured, scenario="no-stragglers"):
    r = ScenarioResult(scenario, [])
    r.rank, r.step = [np.array([0, 1])], [4]
    r.predicted_ns, r.measured_ns = [np.array(predicted)], [np.array(measured)]
    r.start_ns = [np.zeros(len(measured), dtype=np.int64)]
    return r


def test_a_negative_predicted_step_is_withheld_with_the_rank_step_named():
    s = _result([-40_000_000, 5_000_000], [80_000_000, 79_000_000]).summary(None)
    assert s["predicted_step_ns"] is None and s["delta_frac"] is None
    assert "rank 0 step 4" in s["withheld"]


def test_a_positive_prediction_is_shown():
    s = _result([20_000_000, 21_000_000], [80_000_000, 79_000_000]).summary(None)
    assert s["predicted_step_ns"] == 21_000_000 and s["withheld"] is None


def test_the_job_step_is_the_longest_span_less_the_gain_on_the_window():
    # rank 1 started 30 ms after rank 0: the window ends at 110 ms; the replay ends it 40 ms earlier
    r = _result([60_000_000, 40_000_000], [80_000_000, 80_000_000])
    r.start_ns = [np.array([0, 30_000_000])]
    s = r.summary(None)
    assert s["measured_step_ns"] == 80_000_000 and s["predicted_step_ns"] == 40_000_000 and s["saved_ns"] == 40_000_000


def test_an_unchanged_replay_off_the_measurement_stops_the_predictions():
    _check_unchanged(_result([80_000_000, 79_000_000], [80_000_000, 79_000_000], "unchanged"), 1)
    with pytest.raises(DataError, match=r"off the measurement by more than 1% on 1 rank-steps \(rank 1 step 4"):
        _check_unchanged(_result([80_000_000, 236_000_000], [80_000_000, 79_000_000], "unchanged"), 1)
