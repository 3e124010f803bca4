"""The unchanged replay on real recorded CPU runs of examples/train_gpt.py (torchrun, gloo): each
rank's step reproduced within 0.1% on a data-parallel run, a pipeline run and a TP x DP run;
removing host gaps never lengthens a step; the store gets the rows."""

import pytest

from bprof.whatif.run import whatif
from tests.analyzers import recorded

pytestmark = pytest.mark.slow
RUNS = {  # name: (ranks, trainer args)
    "dp2": (2, []),
    "pp2": (2, ["--dp", "1", "--pp", "2", "--microbatches", "4", "--layers", "4"]),  # --dp 1 overrides the recorder's
    "tp2dp2": (4, ["--tp", "2", "--dp", "2"]),
}


@pytest.fixture(scope="module", params=list(RUNS))
def run(request, tmp_path_factory):
    nproc, args = RUNS[request.param]
    db = recorded.record_train_gpt(tmp_path_factory.mktemp(request.param), request.param, args, nproc=nproc)
    con, run_id = recorded.analysed(db, None)
    yield request.param, con, run_id
    con.close()


def test_unchanged_replay_reproduces_every_rank_step(run):
    name, con, run_id = run
    out = whatif(con, run_id, ["no-host-gaps", "scale:gemm=1.0", "perfect-overlap"])
    base = out.summaries[0]
    assert base["num_steps"] == 3 and base["num_ranks"] == RUNS[name][0]
    assert base["max_error_frac"] <= 0.001, base
    # the replay joins ranks at real collectives (not only solo calls)
    joined = con.execute("SELECT count(*) FROM _wi_members WHERE solo_rank = -1").fetchone()[0]
    assert joined > 0
    no_gaps, identity, overlap = out.results[1:]
    for p, m in zip(no_gaps.predicted_ns, no_gaps.measured_ns):
        assert (p <= m).all()
    assert [p.tolist() for p in identity.predicted_ns] == [m.tolist() for m in identity.measured_ns]
    for p, m in zip(overlap.predicted_ns, overlap.measured_ns):
        assert (p <= m).all()
    # CPU runs have host gaps (Python between ops): removing them shortens the step
    assert out.summaries[1]["delta_frac"] < 0
    stored = con.execute("SELECT count(*), max(abs(predicted_ns - measured_ns) / measured_ns) FROM whatif "
                         "WHERE run_id = ? AND scenario = 'unchanged'", [run_id]).fetchone()
    assert stored[0] == 3 * RUNS[name][0] and stored[1] <= 0.001


def test_microbatches_on_the_pipeline_run(run):
    name, con, run_id = run
    if name != "pp2":
        pytest.skip("microbatches=M needs a pipeline")
    out = whatif(con, run_id, ["microbatches=4", "microbatches=8", "microbatches=2"])
    base, same, more, fewer = out.summaries
    # the measured count (4) reproduces every rank-step; more micro-batches of positive work take longer
    assert [p.tolist() for p in out.results[1].predicted_ns] == [m.tolist() for m in out.results[1].measured_ns]
    assert fewer["predicted_step_ns"] < base["measured_step_ns"] < more["predicted_step_ns"]


def test_dp_on_the_data_parallel_runs(run):
    name, con, run_id = run
    if name == "pp2":
        pytest.skip("dp=N needs a data-parallel group")
    out = whatif(con, run_id, ["dp=2", "dp=16"])
    base, same, more = out.results
    assert [p.tolist() for p in same.predicted_ns] == [m.tolist() for m in same.measured_ns]
    # fitted latency and bandwidth are >= 0 and a ring's cost grows with its ranks: never shorter
    for p, m in zip(more.predicted_ns, more.measured_ns):
        assert (p >= m).all()
    assert "grow to 16" in out.summaries[2]["assumptions"][0]
