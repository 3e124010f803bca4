"""`dp=N`: the alpha-beta fit on exact transfers, and the re-costed data-parallel collectives of a
bprof.synth.fleet run (its reduce-scatters take a fixed 1.5 ms on 2 ranks) against the arithmetic."""

import numpy as np
import pytest

from bprof.errors import UsageError
from bprof.synth.fleet import Fleet
from bprof.whatif.run import whatif
from bprof.whatif.scaleout import coefficients, fit, model_ns
from bprof.whatif.scenarios import DataParallel, parse
from tests.whatif.fleets import analysed_fleet

SMALL = dict(tp=2, pp=2, dp=2, microbatches=4, tp_per_forward=4, tp_per_backward=8, dp_collectives=4)


def test_fit_recovers_latency_and_bandwidth_and_says_when_it_cannot():
    op = np.array(["all_reduce"] * 3 + ["all_gather"] * 2, dtype=object)
    size = np.array([1_000, 1_000_000, 50_000_000, 4_000, 8_000_000])
    n = np.array([4, 4, 4, 8, 8])
    transfer = np.array([model_ns(o, b, k, 7e-6, 1 / 20e9) for o, b, k in zip(op, size, n)])
    latency, per_byte, how = fit(op, size, n, transfer)
    assert latency == pytest.approx(7e-6) and per_byte == pytest.approx(1 / 20e9) and how == "latency and bandwidth fitted"
    latency, per_byte, how = fit(op[:1].repeat(3), size[:1].repeat(3), n[:1].repeat(3), transfer[:1].repeat(3))
    assert latency == 0 and how.startswith("bandwidth only")
    assert model_ns("all_reduce", 1_000, 4, latency, per_byte) == pytest.approx(transfer[0])


def test_coefficients_are_the_collective_model():
    assert coefficients("all_reduce", 8) == (14.0, 1.75)
    assert coefficients("reduce_scatter", 2) == (1.0, 0.5)
    assert coefficients("all_reduce", 8, "tree") == (6.0, 1.75)
    assert coefficients("broadcast", 1) == (0.0, 0.0)


@pytest.mark.parametrize("text", ["dp", "dp=0", "dp=x", "dp=2.5"])
def test_bad_dp_is_a_usage_error(text):
    with pytest.raises(UsageError, match="expected dp="):
        parse(text)


def test_a_coll_part_gives_dp_its_link():
    parts = parse("dp=8+coll:bw=100,lat=5")
    assert isinstance(parts[0], DataParallel) and parts[0].link is parts[1]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    con, truth = analysed_fleet(tmp_path_factory, "dp2", Fleet(**SMALL))
    yield con, truth
    con.close()


def test_dp_recosts_the_data_parallel_collectives(fleet):
    con, truth = fleet
    out = whatif(con, truth.run_id, ["dp=2", "dp=4", "coll:bw=100,lat=5", "coll:bw=100,lat=5+dp=8"])
    base, same, four, link, link8 = out.summaries
    # the run's own size is the identity
    assert all((p == m).all() for p, m in zip(out.results[1].predicted_ns, out.results[1].measured_ns))
    # every reduce-scatter is 100 MB in 1.5 ms on 2 ranks: bandwidth only, 100 MB x 1/2 / 1.5 ms; on 4 ranks
    # its transfer is x (3/4) / (1/2): +0.75 ms each, and the step's 4 of them run one after the other
    assert "bandwidth only" in four["assumptions"][0]
    assert four["predicted_step_ns"] - base["measured_step_ns"] == pytest.approx(4 * 750_000, abs=4)
    # with a coll: part the link is given: (7 - 1) x 5 us + (7/8 - 1/2) x 100 MB / 100 GB/s more per collective
    assert link8["predicted_step_ns"] - link["predicted_step_ns"] == 4 * (30_000 + 375_000)
    assert "from coll:bw=100,lat=5" in link8["assumptions"][1]


def test_a_run_without_data_parallel_groups_is_a_usage_error(tmp_path_factory):
    con, truth = analysed_fleet(tmp_path_factory, "dp1", Fleet(**{**SMALL, "dp": 1}))
    with pytest.raises(UsageError, match="no data-parallel group"):
        whatif(con, truth.run_id, ["dp=8"])
