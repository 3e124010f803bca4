"""bprof.synth.fleet: a fleet-sized job written straight into a store, checked small against its
own truth - the 1F1B schedule, the planted slow rank found and priced, host clocks recovered."""

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.synth.fleet import Fleet, job_steps, schedule_1f1b, simulate, write_fleet

SMALL = dict(tp=2, pp=4, dp=2, microbatches=8, tp_per_forward=6, tp_per_backward=12, dp_collectives=4)


def test_1f1b_order_per_stage():
    assert schedule_1f1b(0, 4, 4) == [("F", 0), ("F", 1), ("F", 2), ("F", 3), ("B", 0), ("B", 1), ("B", 2), ("B", 3)]
    assert schedule_1f1b(3, 4, 4) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]
    assert schedule_1f1b(1, 4, 4) == [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]


def test_a_slow_rank_makes_every_step_longer():
    f = Fleet(**SMALL, slow_rank=5, slow_factor=1.5)
    slow, healthy = job_steps(simulate(f)), job_steps(simulate(f, slow=False))
    assert all(s > h for s, h in zip(slow, healthy))


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory):
    con = open_store(tmp_path_factory.mktemp("fleet") / "s.duckdb")
    truth = write_fleet(con, Fleet(**SMALL, slow_rank=5, slow_factor=1.3))
    analysis.analyze_run(con, truth.run_id, Options())
    return con, truth


def test_rows_are_what_cross_rank_analysis_reads(fleet_store):
    con, truth = fleet_store
    per_rank_step = con.execute("SELECT count(*) FROM collectives WHERE run_id = ? GROUP BY rank, step",
                                [truth.run_id]).fetchall()
    assert {n for (n,) in per_rank_step} == {truth.rows_per_rank_step["min"], truth.rows_per_rank_step["max"]}
    assert sum(n for (n,) in per_rank_step) == truth.num_collective_rows
    statuses = dict(con.execute("SELECT status, count(*) FROM match_instances WHERE run_id = ? GROUP BY ALL",
                                [truth.run_id]).fetchall())
    assert set(statuses) == {"complete"}


def test_planted_slow_rank_is_found_and_priced(fleet_store):
    con, truth = fleet_store
    [(ranks, cause, lost)] = con.execute("""
        SELECT evidence->>'$.ranks', evidence->>'$.cause', lost_ns FROM findings
        WHERE run_id = ? AND analyzer = 'stragglers'""", [truth.run_id]).fetchall()
    assert ranks == "[5]" and cause == "device"
    assert lost == pytest.approx(truth.lost_ns, rel=0.25)


def test_host_clocks_are_recovered(fleet_store):
    con, truth = fleet_store
    offsets = dict(con.execute("SELECT host, offset_ns FROM clock_hosts WHERE run_id = ?", [truth.run_id]).fetchall())
    assert len(offsets) == len(truth.host_offset_ns)
    for h, planted in enumerate(truth.host_offset_ns.tolist()):
        assert abs(offsets[f"node{h}"] + planted) <= 20_000  # aligned = own + offset: offset = -planted


def test_bubble_is_measured_against_1f1b_theory(fleet_store):
    con, truth = fleet_store
    [(stages, micro, measured, theory)] = con.execute("""
        SELECT num_stages, num_microbatches, bubble_frac_measured, bubble_frac_theory FROM bubbles_runs WHERE run_id = ?""",
        [truth.run_id]).fetchall()
    assert (stages, micro) == (4, 8) and theory == pytest.approx(3 / 11)
    assert 0 < measured < 0.6
