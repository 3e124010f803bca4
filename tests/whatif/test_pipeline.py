"""`microbatches=M`: the pipeline model exactly on inline stages, and against simulated truth: a
4-micro-batch bprof.synth.fleet run (reduced ranks) predicts the step a simulated 8-micro-batch
fleet measures, and back; the same on bprof.synth GPU traces, 1F1B and GPipe."""

import numpy as np
import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.errors import UsageError
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.synth import Scenario, write_run
from bprof.synth.fleet import Fleet
from bprof.whatif.pipeline import Pipeline, StageTimes, flow_shop_ns, order, stage_ends
from bprof.whatif.run import ScenarioResult, whatif
from bprof.whatif.scenarios import MicroBatches
from tests.whatif.fleets import analysed_fleet

SMALL = dict(tp=2, pp=4, dp=2, tp_per_forward=6, tp_per_backward=12, dp_collectives=4)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("microbatches", [1, 2, 4, 8])
def test_equal_stages_without_transfer_take_m_plus_p_minus_1_chunks(schedule, microbatches):
    # p stages of forward 100 and backward 200 ns, free transfers: the first stage ends the step after
    # (m + p - 1)(F + B); stage s ends 200 ns (a backward) per stage before it: its last backward runs earlier
    p, zero = 4, np.zeros(4, dtype=np.int64)
    t = StageTimes(zero, zero, np.full(p, 100), np.full(p, 200), zero, zero)
    ends = stage_ends(t, schedule, microbatches)
    assert ends.tolist() == [(microbatches + p - 1) * 300 - 200 * s for s in range(p)]


@pytest.mark.parametrize("work, m", [([940, 930], 3), ([5, 7, 3], 4), ([10], 5), ([3, 9, 3, 3], 8)])
def test_flow_shop_replay_is_the_makespan_formula(work, m):
    # what the bubbles analysis prices stage imbalance with: sum(t) + (m - 1) max(t)
    assert flow_shop_ns(np.array(work), m) == sum(work) + (m - 1) * max(work)


def test_1f1b_order():
    assert order("1f1b", 0, 2, 3) == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("B", 2)]
    assert order("1f1b", 1, 2, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    assert order("gpipe", 1, 2, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


def test_transfers_and_pre_post_lengthen_the_step():
    p, zero = 3, np.zeros(3, dtype=np.int64)
    base = stage_ends(StageTimes(zero, zero, np.full(p, 100), np.full(p, 200), zero, zero), "1f1b", 4)
    slow = stage_ends(StageTimes(zero, np.full(p, 50), np.full(p, 100), np.full(p, 200), np.full(p, 10), np.full(p, 70)), "1f1b", 4)
    assert (slow > base).all()


@pytest.fixture(scope="module")
def fleets(tmp_path_factory):
    out = {m: analysed_fleet(tmp_path_factory, f"mb{m}", Fleet(**SMALL, microbatches=m)) for m in (4, 8)}
    yield out
    for con, _ in out.values():
        con.close()


@pytest.mark.parametrize("measured, target", [(4, 8), (8, 4)])
def test_fleet_predicts_the_step_of_the_other_micro_batch_count(fleets, measured, target):
    con, truth = fleets[measured]
    other_con, other_truth = fleets[target]
    out = whatif(con, truth.run_id, [f"microbatches={measured}", f"microbatches={target}"])
    base, same, predicted = out.summaries
    # the measured count reproduces the measured step, rank by rank
    assert same["predicted_step_ns"] == base["measured_step_ns"]
    assert all((p == m).all() for p, m in zip(out.results[1].predicted_ns, out.results[1].measured_ns))
    # the simulated fleet with the other count: the same job-step definition (longest rank's span) ...
    actual = whatif(other_con, other_truth.run_id, [], write=False).summaries[0]["measured_step_ns"]
    assert predicted["predicted_step_ns"] == pytest.approx(actual, rel=0.03), (predicted, actual)
    # ... and the simulation's own (latest end - earliest start): the change it predicts is the change
    predicted_change = predicted["predicted_step_ns"] - predicted["measured_step_ns"]
    true_change = np.median(other_truth.step_ns) - np.median(truth.step_ns)
    assert predicted_change == pytest.approx(true_change, rel=0.05), (predicted_change, true_change)
    assumption = predicted["assumptions"][0]
    assert assumption.startswith(f"microbatches={target}: the run's 1f1b") and "pipeline of 4 stages" in assumption
    # 4 micro-batches on 4 stages send alike under 1F1B and GPipe: the schedule is assumed, and said so
    assert ("assumed" in assumption) == (measured == 4)
    stored = con.execute("SELECT predicted_step_ns FROM whatif_runs WHERE run_id = ? AND scenario = ?",
                         [truth.run_id, f"microbatches={target}"]).fetchone()
    assert stored == (predicted["predicted_step_ns"],)


def test_microbatches_applies_after_the_other_parts(tmp_path_factory):
    con, truth = analysed_fleet(tmp_path_factory, "slow", Fleet(**SMALL, microbatches=4, slow_rank=5, slow_factor=1.3))
    out = whatif(con, truth.run_id, ["microbatches=8", "no-stragglers+microbatches=8", "microbatches=8+no-stragglers"],
                 write=False)
    alone, first, last = out.summaries[1:]
    assert first["predicted_step_ns"] == last["predicted_step_ns"] < alone["predicted_step_ns"]


def test_a_run_without_pipeline_is_a_usage_error(tmp_path_factory):
    con, truth = analysed_fleet(tmp_path_factory, "nopp", Fleet(tp=2, pp=1, dp=2, microbatches=4, tp_per_forward=4,
                                                           tp_per_backward=8, dp_collectives=2))
    with pytest.raises(UsageError, match="has no pipeline"):
        whatif(con, truth.run_id, ["microbatches=8"])


@pytest.fixture(scope="module")
def synth_runs(tmp_path_factory):
    """bprof.synth GPU traces (kernels on a compute and a comm stream, p2p unmatched: solo calls) of a
    4-stage pipeline, 1F1B and GPipe, with 4 and 8 micro-batches."""
    out, cons = {}, []
    for schedule in ("1f1b", "gpipe"):
        for m in (4, 8):
            base = tmp_path_factory.mktemp(f"{schedule}{m}")
            write_run(Scenario(pp=4, dp=1, tp=1, steps=3, vocab=1024, seed=3, microbatches=m, schedule=schedule), base / "run")
            con = open_store(base / "s.duckdb")
            [r] = ingest_paths(con, [base / "run"], IngestOptions(name="synth"))
            analysis.analyze_run(con, r.run_id, Options())
            out[schedule, m] = (con, r.run_id)
            cons.append(con)
    yield out
    for con in cons:
        con.close()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("measured, target", [(4, 8), (8, 4)])
def test_synthetic_gpu_traces_predict_the_other_micro_batch_count(synth_runs, schedule, measured, target):
    con, run_id = synth_runs[schedule, measured]
    other_con, other_id = synth_runs[schedule, target]
    predicted = whatif(con, run_id, [f"microbatches={target}"], write=False).summaries[1]
    actual = whatif(other_con, other_id, [], write=False).summaries[0]["measured_step_ns"]
    assert predicted["predicted_step_ns"] == pytest.approx(actual, rel=0.03), (predicted, actual)


def test_mfu_counts_the_micro_batches_work():
    # 8 micro-batches instead of 4 in 1.5x the step: twice the model FLOPs, MFU x 2 / 1.5
    part = MicroBatches(8, pipe=Pipeline(2, 4, "1f1b"))
    res = ScenarioResult("microbatches=8", [part], [np.array([0])], [0], [np.array([150])], [np.array([100])], [np.array([0])])
    assert res.summary(0.3)["predicted_mfu_frac"] == pytest.approx(0.3 * 100 / 150 * 2)
