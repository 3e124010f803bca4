"""What-if on bprof.synth.fleet runs (reduced ranks, no events): the unchanged replay reproduces
every rank's step exactly at 1,024 ranks, and `no-stragglers` on a planted slow rank predicts the
step the simulation gives without it."""

import pytest

from bprof.synth.fleet import Fleet
from bprof.whatif.run import whatif
from tests.whatif.fleets import analysed_fleet

SMALL = dict(tp=2, pp=4, dp=2, microbatches=8, tp_per_forward=6, tp_per_backward=12, dp_collectives=4)


@pytest.fixture(scope="module")
def fleet_1k(tmp_path_factory):
    # tp8 x pp8 x dp16 = 1,024 ranks, 16 micro-batches, one planted slow rank (as benchmarks/crossrank.py)
    con, truth = analysed_fleet(tmp_path_factory, "f1k", Fleet(tp=8, pp=8, dp=16, steps=1, slow_rank=333, slow_factor=1.3))
    yield con, truth
    con.close()


def test_1024_ranks_unchanged_replay_is_exact_and_no_stragglers_predicts_the_healthy_step(fleet_1k):
    con, truth = fleet_1k
    out = whatif(con, truth.run_id, ["no-stragglers", "no-host-gaps", "scale:gemm=0.5"])
    base, healthy, no_gaps, scaled = out.summaries
    assert base["num_ranks"] == 1024 and base["max_error_frac"] == 0
    assert 333 in out.results[1].parts[0].ranks
    _predicts_healthy(healthy, truth)
    # reduced ranks have no events: nothing to remove or scale, and the assumptions say so
    assert no_gaps["predicted_step_ns"] == scaled["predicted_step_ns"] == base["predicted_step_ns"]
    assert "1024 ranks have no events" in no_gaps["assumptions"][-1]


def test_no_stragglers_on_a_healthy_fleet_changes_nothing(tmp_path_factory):
    con, truth = analysed_fleet(tmp_path_factory, "healthy", Fleet(**SMALL))
    out = whatif(con, truth.run_id, ["no-stragglers"])
    assert out.results[1].parts[0].ranks == []
    assert out.summaries[1]["predicted_step_ns"] == out.summaries[0]["measured_step_ns"]


def test_small_fleet_slow_rank(tmp_path_factory):
    con, truth = analysed_fleet(tmp_path_factory, "small", Fleet(**SMALL, slow_rank=5, slow_factor=1.3))
    out = whatif(con, truth.run_id, ["no-stragglers"])
    assert out.results[1].parts[0].ranks == [5]
    _predicts_healthy(out.summaries[1], truth)


def _predicts_healthy(summary, truth):
    """The simulation's job step is the latest end minus the earliest start, bprof's the longest
    rank's span: the predicted change (delta_frac) applied to the simulated step must give the
    simulated healthy step within 3%, and miss it by less than a quarter of what the slow rank cost."""
    for step_ns, healthy_ns in zip(truth.step_ns, truth.healthy_step_ns):
        predicted = step_ns * (1 + summary["delta_frac"])
        assert predicted == pytest.approx(healthy_ns, rel=0.03), (summary, truth.step_ns, truth.healthy_step_ns)
        assert abs(predicted - healthy_ns) < 0.25 * (step_ns - healthy_ns), (summary, truth.step_ns, truth.healthy_step_ns)
