"""End to end on real recordings: a short baseline series of examples/train_gpt.py on 2 CPU ranks,
kept in a --history file, and a candidate whose rank 1 computes about 5 extra steps' worth per step
(~6x the step: far outside any noise this machine makes) fails the gate, which names rank 1's
compute and its executed FLOPs. No A/A here: whether unchanged runs pass on a noisy machine is benchmarks/ci_gate.py's question."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bprof.store.db import open_store
from tests.analyzers.recorded import record_train_gpt

SMALL = ["--layers", "2", "--hidden", "64", "--seq", "64"]
LABELS = ["--benchmark", "e2e", "--branch", "main"]


def bprof(*args):
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_a_planted_straggler_fails_the_gate_and_is_named(tmp_path):
    history = tmp_path / "history.duckdb"
    step_ms = []
    for i in range(5):
        db = record_train_gpt(tmp_path, f"base{i}", SMALL, record_args=LABELS)
        done = bprof("ci", "record", f"base{i}", "--db", db, "--history", history)
        assert done.returncode == 0, done.stderr
        step_ms.append(float(done.stdout.split("step time ")[1].split(" ms")[0]))
    slow_ms = 5 * sorted(step_ms)[2]
    db = record_train_gpt(tmp_path, "slow", [*SMALL, "--slow-rank", "1", "--slow-ms", f"{slow_ms:.0f}"], record_args=LABELS)
    done = bprof("ci", "check", "slow", "--db", db, "--history", history, "--metric", "step_time",
                 "--confidence", "0.95", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads(done.stdout)
    [step] = data["metrics"]
    assert step["verdict"] == "regression" and step["change_frac"] > 0.5
    why = data["explanation"]
    assert (why["top_part"], why["critical_rank"]) == ("compute", 1)
    # the planted loop is extra work on rank 1: the headline leads with it, then the step parts
    assert why["headline"].startswith("executed FLOPs on rank 1 grew +")
    assert why["headline"].split("; step parts: ")[1].startswith("compute on rank 1 ")
    assert why["parts"][0]["delta_ns"] > 0.5 * slow_ms * 1e6
    # gated on work, the same candidate fails on executed FLOPs alone: collectives did not change
    done = bprof("ci", "check", "slow", "--db", db, "--history", history, "--metric", "executed_flops",
                 "--metric", "collective_calls", "--metric", "collective_bytes", "--json")
    assert done.returncode == 1, done.stdout + done.stderr
    data = json.loads(done.stdout)
    verdicts = {m["metric"]: m for m in data["metrics"]}
    assert verdicts["executed_flops"]["verdict"] == "regression" and verdicts["executed_flops"]["change_frac"] > 0.5
    assert all(abs(verdicts[m]["change_frac"]) < 1e-12 for m in ("collective_calls", "collective_bytes"))
    assert [(w["family"], w["name"]) for w in data["explanation"]["work"]] == [("work_flops", "rank 1")]
    # bprof record kept what comparability needs: the ranks' torch version and thread count, the labels
    con = open_store(db, read_only=True)
    try:
        benchmark, branch, metadata = con.execute("SELECT benchmark, git_branch, metadata FROM runs").fetchone()
    finally:
        con.close()
    environment = json.loads(metadata)["environment"]
    assert (benchmark, branch) == ("e2e", "main")
    assert environment["torch_version"].startswith("2.") and environment["intra_op_threads"] == 1
    assert data["unknown_facts"] == []
