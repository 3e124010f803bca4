"""Every analysis is deterministic: the same traces ingested into two stores and analysed give the
same findings, to the nanosecond and the character, and the same what-if predictions (issue 20)."""

import json

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.synth import Fault, Scenario, write_run
from bprof.whatif.run import whatif

SCENARIOS = ["no-stragglers", "no-host-gaps", "free-comm:dp", "perfect-overlap", "no-stragglers+no-host-gaps"]


def _analysed(path, run_dir):
    con = open_store(path)
    [r] = ingest_paths(con, [run_dir], IngestOptions(name="same"))
    analysis.analyze_run(con, r.run_id, Options())
    findings = con.execute("""SELECT analyzer, severity, lost_ns, title, detail, evidence FROM findings
                              WHERE run_id = ? ORDER BY analyzer, title, lost_ns""", [r.run_id]).fetchall()
    predicted = [(s["scenario"], s["predicted_step_ns"], s["saved_ns"])
                 for s in whatif(con, r.run_id, SCENARIOS, write=False).summaries]
    metrics = con.execute("SELECT name, value FROM metrics WHERE run_id = ? ORDER BY name", [r.run_id]).fetchall()
    con.close()
    return findings, predicted, metrics


def test_the_same_traces_give_the_same_analysis_twice(tmp_path):
    write_run(Scenario(tp=2, pp=2, dp=2, steps=3, microbatches=4, seed=5,
                       faults=[Fault("slow_rank", rank=5, extra_ns=8_000_000), Fault("stalled_input", rank=2, extra_ns=4_000_000)]),
              tmp_path / "run")
    first = _analysed(tmp_path / "a.duckdb", tmp_path / "run")
    second = _analysed(tmp_path / "b.duckdb", tmp_path / "run")
    assert first[0] and any(f[2] for f in first[0])  # something was found and priced
    assert first[0] == second[0]
    assert first[1] == second[1]
    assert first[2] == second[2]
    assert all(json.loads(e) is not None for *_, e in first[0] if e)
