"""What-if on synthetic runs with events (bprof.synth: GPU traces, tp2 x pp2 x dp2, two hosts):
the unchanged replay is exact; scale:X=1 is the identity; removing host gaps or perfect overlap
never lengthens a step; a planted input stall is what no-host-gaps removes; the store gets one
set of rows per scenario, written all or nothing; the CLI's usage errors."""

import json
import subprocess
import sys

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.errors import UsageError
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.synth import Fault, Scenario, write_run
from bprof.whatif import run as whatif_run
from bprof.whatif.run import whatif

STALL_NS = 20_000_000


@pytest.fixture(scope="module")
def stalled(tmp_path_factory):
    out = tmp_path_factory.mktemp("stalled")
    truth = write_run(Scenario(tp=2, pp=2, dp=2, steps=3, hosts=2, seed=3,
                               faults=[Fault("stalled_input", rank=1, extra_ns=STALL_NS)]), out / "run")
    con = open_store(out / "s.duckdb")
    [r] = ingest_paths(con, [out / "run"], IngestOptions(name="stalled"))
    analysis.analyze_run(con, r.run_id, Options())
    yield con, r.run_id, truth, out / "s.duckdb"
    con.close()


def test_unchanged_replay_is_exact_and_scenarios_bound_the_step(stalled):
    con, run_id, truth, _ = stalled
    out = whatif(con, run_id, ["scale:gemm=1", "scale:gemm=0.5", "no-host-gaps", "perfect-overlap",
                               "no-host-gaps+perfect-overlap"])
    base, identity, faster, no_gaps, overlap, both = out.results
    assert out.summaries[0]["max_error_frac"] == 0 and out.summaries[0]["num_ranks"] == 8
    for p, m in zip(base.predicted_ns, base.measured_ns):
        assert p.tolist() == m.tolist()
    for p, m in zip(identity.predicted_ns, identity.measured_ns):
        assert p.tolist() == m.tolist()
    for res in (faster, no_gaps, overlap, both):
        for p, m in zip(res.predicted_ns, res.measured_ns):
            assert (p <= m).all(), res.scenario
    for p, q in zip(both.predicted_ns, no_gaps.predicted_ns):
        assert (p <= q).all()
    assert out.summaries[2]["delta_frac"] < -0.05  # GEMMs are most of a synthetic step


def test_no_host_gaps_removes_a_planted_input_stall(stalled):
    """The stalled rank's device idles while its host waits for data; the simulation re-run without
    the stall says what the job's step gains. Removing host gaps removes the stall and the ordinary
    launch gaps too, so it gains at least the stall's cost, and not much more."""
    con, run_id, truth, _ = stalled
    out = whatif(con, run_id, ["no-host-gaps"], write=False)
    measured, predicted = out.results[1].job_steps()
    gained = [m - p for m, p in zip(measured, predicted)]
    planted = max(truth["faults"][0]["counterfactual"]["step_dur_delta_ns"])
    assert min(gained) >= 0.75 * planted, (gained, planted)
    assert max(gained) <= planted + 0.05 * max(measured), (gained, planted)


def test_rows_are_stored_and_replaced_per_scenario(stalled):
    con, run_id, _, _ = stalled
    whatif(con, run_id, ["perfect-overlap"])
    whatif(con, run_id, ["perfect-overlap"])
    rows = dict(con.execute("SELECT scenario, count(*) FROM whatif WHERE run_id = ? GROUP BY ALL", [run_id]).fetchall())
    assert rows["unchanged"] == rows["perfect-overlap"] == 8 * 3
    [(n, assumptions)] = con.execute("SELECT count(*), any_value(assumptions) FROM whatif_runs WHERE run_id = ? "
                                     "AND scenario = 'perfect-overlap'", [run_id]).fetchall()
    assert n == 1 and assumptions[0].startswith("perfect-overlap:")


def test_a_failed_write_leaves_the_store_as_it_was(stalled, monkeypatch):
    con, run_id, _, _ = stalled
    whatif(con, run_id, ["no-host-gaps"])
    before = con.execute("SELECT * FROM whatif_runs WHERE run_id = ? ORDER BY scenario", [run_id]).fetchall()
    rows = con.execute("SELECT count(*) FROM whatif WHERE run_id = ?", [run_id]).fetchone()

    real = whatif_run.ScenarioResult.summary

    def broken(self, mfu):
        s = real(self, mfu)
        if self.scenario == "no-host-gaps":
            s["num_steps"] = None  # violates NOT NULL after the unchanged rows went in
        return s

    monkeypatch.setattr(whatif_run.ScenarioResult, "summary", broken)
    with pytest.raises(Exception):
        whatif(con, run_id, ["no-host-gaps"])
    assert con.execute("SELECT * FROM whatif_runs WHERE run_id = ? ORDER BY scenario", [run_id]).fetchall() == before
    assert con.execute("SELECT count(*) FROM whatif WHERE run_id = ?", [run_id]).fetchone() == rows


def test_unknown_op_name_is_a_usage_error(stalled):
    con, run_id, _, _ = stalled
    with pytest.raises(UsageError, match="neither a kernel class"):
        whatif(con, run_id, ["scale:no_such_kernel=0.5"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", "whatif", *args], capture_output=True, text=True, timeout=300)


def test_cli(tmp_path):
    write_run(Scenario(tp=1, pp=1, dp=2, steps=3, seed=1), tmp_path / "run")
    for name in ("analysed", "fresh"):
        con = open_store(tmp_path / f"{name}.duckdb")
        [r] = ingest_paths(con, [tmp_path / "run"], IngestOptions(name=name, work_dir=tmp_path))
        if name == "analysed":
            analysis.analyze_run(con, r.run_id, Options())
        con.close()
    db = str(tmp_path / "analysed.duckdb")
    done = _cli("--db", db, "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert len(out["rows"]) == 2 * 3 and all(r["predicted_ns"] == r["measured_ns"] for r in out["rows"])
    done = _cli("--db", db, "-s", "no-host-gaps", "-s", "scale:gemm=0.8+perfect-overlap")
    assert done.returncode == 0, done.stderr
    assert "scale:gemm=0.8+perfect-overlap" in done.stdout and "assumptions:" in done.stdout
    for bad in (["-s", "nonsense"], ["-s", "scale:gemm=0"], ["no-such-run"]):
        done = _cli("--db", db, *bad)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    done = _cli("--db", str(tmp_path / "fresh.duckdb"))
    assert done.returncode == 2 and "run `bprof analyze 1` first" in done.stderr, done.stderr
