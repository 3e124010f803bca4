"""The joint counterfactual: the priced findings' causes removed together, by the one engine."""

import json

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.analyzers.joint import scenario_parts
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.synth import Fault, Scenario, write_run
from bprof.whatif.run import whatif


def test_each_cause_maps_to_its_scenario_once_in_a_fixed_order():
    rows = [("breakdown", "Exposed DP communication: 3 ms", {"dim": "dp"}),
            ("idle", "Device idle after host syncs", {"cause": "sync"}),
            ("stragglers", "Straggler: rank 3", {"ranks": [3]}),
            ("stragglers", "Small straggler: rank 5", {"ranks": [5]}),
            ("bubbles", "Stage imbalance: pipeline stage 1", {"stage": 1}),
            ("bubbles", "Pipeline bubble above theory", {}),
            ("phases", "Waiting for data", {})]
    assert scenario_parts(rows) == ["no-stragglers", "no-host-gaps:sync", "no-host-gaps:data_loading", "free-comm:dp",
                                    "balanced-stages"]


def test_a_straggler_run_gets_the_joint_prediction_of_its_findings(tmp_path):
    write_run(Scenario(tp=2, pp=1, dp=2, steps=3, hosts=1, seed=3,
                       faults=[Fault("slow_rank", rank=3, extra_ns=20_000_000)]), tmp_path / "run")
    con = open_store(tmp_path / "s.duckdb")
    [r] = ingest_paths(con, [tmp_path / "run"], IngestOptions(name="slow"))
    analysis.analyze_run(con, r.run_id, Options())
    [(title, evidence)] = con.execute("SELECT title, evidence FROM findings WHERE run_id = ? AND analyzer = 'joint'",
                                      [r.run_id]).fetchall()
    evidence = json.loads(evidence)
    assert evidence["scenario"].startswith("no-stragglers+")
    # the same number bprof whatif gives for the same scenario
    [s] = whatif(con, r.run_id, [evidence["scenario"]], write=False).summaries[1:]
    assert evidence["joint_saved_ns"] == s["saved_ns"] > 0
    assert 0 < s["predicted_step_ns"] < s["measured_step_ns"]
    assert f"{s['saved_ns'] / 1e6:.2f} ms" in title
