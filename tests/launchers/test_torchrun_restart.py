"""torchrun's own elastic restart under `bprof record`: rank 1 of 2 raises in iteration 4 of the
first attempt, inside window 3:6; torchrun (--max-restarts=1) restarts both workers, which train
from the start to the end. Both attempts' windows are kept, the cut one marked.

One window (3:6), not two: with two windows in one process (1:3,3:6 or 2:4,4:6) a rank under
bprof record segfaults in the garbage collector at the second window's end, with or without a
restart, with bprof before this change too, but not with two plain torch.profiler sessions
(docs/record.md). A restarted rank opening the same window again is a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_group
from tests.launchers.recording import ROOT, assert_collectives_identified, rank_metas, store

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("restart_train.py")
WINDOWS = "3:6"
FOLDERS = ["iteration_3", "iteration_3.restart1"]


def record_restarted_job(tmp_path: Path) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(tmp_path / "run"), "--db",
           str(tmp_path / "s.duckdb"), "--steps", WINDOWS, "--", sys.executable, "-m", "torch.distributed.run",
           "--standalone", "--max-restarts=1", "--nproc_per_node=2", str(SCRIPT), "--steps", "8",
           "--crash-rank", "1", "--crash-at", "4", "--marker", str(tmp_path / "crashed")]
    return run_group(cmd, timeout=240, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_restarted_ranks_append_to_the_recording_and_the_cut_window_is_marked(tmp_path):
    done = record_restarted_job(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "crashed").read_text() == "rank 1 crashed at iteration 4 of attempt 0\n"
    assert all(f"restart_train: rank {r} attempt 1 done" in done.stdout for r in (0, 1))

    # every window of both attempts on disk, beside each other: nothing overwritten
    traces = tmp_path / "run" / "traces"
    assert sorted(p.name for p in traces.iterdir()) == FOLDERS
    for folder in FOLDERS:
        assert sorted(p.name for p in (traces / folder).glob("rank*.json.gz")) == ["rank0.json.gz", "rank1.json.gz"]
    metas = rank_metas(tmp_path)
    assert sorted(metas) == [0, 1] and len({m["run_id"] for m in metas.values()}) == 1
    for r, m in metas.items():
        windows = [(w["window"], w["attempt"], w["partial"], w.get("cut_at_iteration"), w.get("cut_by_restart"))
                   for w in m["windows_captured"]]
        assert windows == [("3:6", 0, True, 4, 1), ("3:6", 1, False, None, None)], r
        assert "window 3:6 of attempt 0 was cut at iteration 4 by the launcher's restart 1" in m["notes"]
        assert m["attempt"] == 1  # the metadata's last writer is the restarted rank

    # one store run per window and attempt, all of the one recording; only the cut one is marked
    assert "window 3:6 of attempt 0 was cut by the launcher's restart 1" in done.stderr
    con = store(tmp_path)
    runs = {name: (run_id, missing, json.loads(meta)) for run_id, name, missing, meta in con.execute(
        "SELECT run_id, name, missing_ranks, metadata FROM runs ORDER BY run_id").fetchall()}
    assert sorted(runs) == [f"run-{f}" for f in FOLDERS]
    assert {m["bprof"]["run_id"] for _, _, m in runs.values()} == {metas[0]["run_id"]}
    for name, (run_id, missing, meta) in runs.items():
        cut = name == "run-iteration_3"
        assert missing == []
        assert meta["window"] == {"window": "3:6", "attempt": 1 if "restart1" in name else 0,
                                  "cut_ranks": [0, 1] if cut else [], "cut_at_iteration": {"0": 4, "1": 4} if cut else {},
                                  "cut_by_restart": 1 if cut else None}, name
    steps = {name: con.execute("SELECT rank, list(step ORDER BY step) FROM steps WHERE run_id = ? GROUP BY rank "
                               "ORDER BY rank", [run_id]).fetchall() for name, (run_id, _, _) in runs.items()}
    assert steps["run-iteration_3.restart1"] == [(0, [3, 4, 5]), (1, [3, 4, 5])]
    assert all(s[:1] == [3] and set(s) <= {3, 4} for _, s in steps["run-iteration_3"])  # step 3, then the cut one
    assert "all_reduce" in assert_collectives_identified(con, runs["run-iteration_3.restart1"][0], 2)
    con.close()

    for name in ("run-iteration_3", "run-iteration_3.restart1"):  # analyze runs cleanly, cut or not
        assert sorted(r["rank"] for r in analyze_run(tmp_path, name)["ranks"]) == [0, 1]


def analyze_run(tmp_path: Path, name: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", "analyze", name, "--db", str(tmp_path / "s.duckdb"),
                           "--json"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
