"""Hang verdicts in the store (`bprof hang --db`, `bprof record --hang-timeout`): the hangs table, the
run row a verdict attaches to, an unchanged store on bad input, and the join with the straggler
analysis of a window captured before the hang (one real recording)."""

from __future__ import annotations

import json

import duckdb
import pytest

from bprof.profiler.hang_watchdog import HANG_EXIT_CODE
from bprof.store.db import open_store
from tests.hang.jobs import bprof, record_faulted
from tests.hang.test_formats import _v2_entry

WORLD = ("0", "default_pg", 0)


def _nccl_dumps(folder, missing=2):
    """4 NCCL ranks stuck at all_reduce #2, rank `missing` without a dump (as test_formats)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    for rank in (r for r in range(4) if r != missing):
        entries = [_v2_entry(0, WORLD, 1, "completed"), _v2_entry(1, WORLD, 2, "started")]
        status = {"0": {"last_enqueued_collective": "2", "last_started_collective": "2", "last_completed_collective": "1"}}
        (folder / f"nccl_trace_rank_{rank}").write_text(json.dumps(
            {"version": "2.10", "entries": entries, "pg_config": config, "pg_status": status}))
    return folder


def _rows(db):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return (con.execute("SELECT * FROM runs ORDER BY run_id").fetchall(),
                con.execute("SELECT * FROM hangs ORDER BY hang_id").fetchall())
    finally:
        con.close()


def test_a_hang_without_a_window_gets_its_own_run(tmp_path):
    dumps, db = _nccl_dumps(tmp_path / "job7"), tmp_path / "s.duckdb"
    done = bprof("hang", str(dumps), "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "verdict stored as hang 1 of run 1" in done.stderr
    con = open_store(db, read_only=True)
    try:
        run = con.execute("SELECT name, num_ranks_ingested, world_size, missing_ranks, fingerprint FROM runs").fetchall()
        assert [r[:4] for r in run] == [("hang-job7", 0, 4, [0, 1, 2, 3])] and run[0][4].startswith("hang:")
        row = con.execute("""SELECT run_id, verdict, world_size, num_dumps, num_stuck_groups, culprit_ranks, culprits,
                                    dead_ranks, late_ranks, detail FROM hangs""").fetchall()
    finally:
        con.close()
    [(run_id, verdict, world, num_dumps, stuck, ranks, culprits, dead, late, detail)] = row
    assert (run_id, world, num_dumps, stuck, ranks, dead, late) == (1, 4, 3, 1, [2], [], None)
    assert verdict == out["verdict"] and json.loads(detail) == out
    [c] = json.loads(culprits)
    assert (c["rank"], c["reason"], c["process_group"], c["last_seq"], c["groups"]) == (2, "no_dump", "0", 1, ["0"])
    assert c["late_before"] is None and "unknown (no dump)" == c["last_collective"]
    # the same dumps again: the same run, their verdict replaced rather than doubled
    again = bprof("hang", str(dumps), "--db", str(db))
    assert again.returncode == 0, again.stderr
    runs, hangs = _rows(db)
    assert len(runs) == 1 and [h[1] for h in hangs] == [1] and hangs[0][0] == 2
    # other dumps of another hang: a run of their own
    other = _nccl_dumps(tmp_path / "job7b", missing=3)
    assert bprof("hang", str(other), "--db", str(db)).returncode == 0
    runs, hangs = _rows(db)
    assert [r[1] for r in runs] == ["hang-job7", "hang-job7b"] and [h[1] for h in hangs] == [1, 2]


def test_bad_input_leaves_the_store_as_it_was(tmp_path):
    dumps, db = _nccl_dumps(tmp_path / "job"), tmp_path / "s.duckdb"
    assert bprof("hang", str(dumps), "--db", str(db)).returncode == 0
    before = _rows(db)
    broken = _nccl_dumps(tmp_path / "broken")
    (broken / "ranks.json").write_text("{not json")
    for args, code, said in (([str(broken)], 3, f"{broken / 'ranks.json'}: unreadable"),
                             ([str(tmp_path / "nope")], 2, "no such file or directory"),
                             ([str(dumps), "--run", "nosuchrun"], 2, "no run 'nosuchrun'")):
        done = bprof("hang", *args, "--db", str(db))
        assert done.returncode == code, (args, done.stderr)
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert _rows(db) == before
    done = bprof("hang", str(dumps), "--run", "1")
    assert done.returncode == 2 and "give --db too" in done.stderr
    fresh = tmp_path / "fresh.duckdb"  # a run of a store that is not there: no store made
    done = bprof("hang", str(dumps), "--db", str(fresh), "--run", "1")
    assert done.returncode == 2 and "no bprof store here" in done.stderr and not fresh.exists()


def test_an_explicit_run_takes_the_verdict(tmp_path):
    dumps, db = _nccl_dumps(tmp_path / "job"), tmp_path / "s.duckdb"
    assert bprof("hang", str(dumps), "--db", str(db)).returncode == 0
    other = _nccl_dumps(tmp_path / "again", missing=1)
    done = bprof("hang", str(other), "--db", str(db), "--run", "hang-job")
    assert done.returncode == 0, done.stderr
    runs, hangs = _rows(db)
    assert len(runs) == 1 and [(h[1], h[9]) for h in hangs] == [(1, [2]), (1, [1])]


@pytest.fixture(scope="module")
def straggler_then_hang(tmp_path_factory):
    """A real 4-rank gloo job: rank 1 sleeps 300 ms before every forward pass of steps 0-2 (a
    straggler in the captured window, steps 1-2), then blocks forever at step 3; recorded with
    --hang-timeout 5 into a store."""
    out = tmp_path_factory.mktemp("straggler_hang")
    db = out / "s.duckdb"
    done = record_faulted("block", out / "run", steps="1:3", db=db, slow_ms=300)
    return out / "run", db, done


def test_the_verdict_says_who_was_late_before_the_hang(straggler_then_hang):
    run_dir, db, done = straggler_then_hang
    assert done.returncode == HANG_EXIT_CODE, done.stderr[-3000:]
    v = json.loads((run_dir / "hang" / "verdict.json").read_text())
    assert [(c["rank"], c["reason"], c["late_before"]) for c in v["culprits"]] == [(1, "not_joined", True)]
    assert v["before"]["analysed"] and v["before"]["late_ranks"] == [1] and v["before"]["steps"] == [1, 2]
    assert "already late in the window captured before" in v["verdict"] and "rank 1 (stuck now" in v["verdict"]
    assert "late in the window before: yes" in done.stderr
    con = open_store(db, read_only=True)
    try:
        # the verdict attaches to the record's ingested window, which the store analysed
        [(run_id, late, verdict)] = con.execute("SELECT run_id, late_ranks, verdict FROM hangs").fetchall()
        assert con.execute("SELECT num_ranks_ingested FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == 4
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
        flagged = con.execute("""SELECT rank FROM stragglers_ranks WHERE run_id = ? AND (flagged OR measurably_slower)
                                 ORDER BY rank""", [run_id]).fetchall()
    finally:
        con.close()
    assert late == [1] and flagged == [(1,)] and verdict == v["verdict"]
    # the offline command on the same run directory and store finds the same run, and replaces its row
    again = bprof("hang", str(run_dir), "--db", str(db), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["before"]["run_id"] == run_id
    assert _rows(db)[1][0][1] == run_id and len(_rows(db)[1]) == 1
