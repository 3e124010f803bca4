"""bprof ingest of a watched recording: the series of every rank in watch_steps (checked against
the Parquet files read by pyarrow), the trigger linked to the window run it produced, a clean job
with no window ingested all the same, re-ingest changing nothing, damaged files named."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bprof.store.db import open_store
from tests.watch.store_recordings import NUM_RANKS, SLOW_FROM, SLOW_MS, SLOW_RANK, STEPS, ingest_both, parquet_rows, recording

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    return recording(tmp_path_factory, "slow")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return recording(tmp_path_factory, "clean")


def bprof(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd)


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    db, _, _, runs = ingest_both(tmp_path_factory, "store")
    return db, runs


def test_every_rank_has_a_row_per_iteration_but_the_first_equal_to_its_parquet(slow, ingested):
    db, _ = ingested
    con = open_store(db, read_only=True)
    try:
        rid = con.execute("SELECT recording_id FROM watch_recordings WHERE source_path = ?", [str(slow)]).fetchone()[0]
        per_rank = con.execute("""SELECT rank, count(*), min(iteration), max(iteration) FROM watch_steps
                                  WHERE recording_id = ? GROUP BY rank ORDER BY rank""", [rid]).fetchall()
        # the program ran STEPS iterations; the first has no step before it to end, so STEPS - 1 rows a rank
        assert per_rank == [(r, STEPS - 1, 1, STEPS - 1) for r in range(NUM_RANKS)]
        for rank in range(NUM_RANKS):
            raw = parquet_rows(slow, rank)
            stored = con.execute("""SELECT iteration, step_ns, busy_ns, data_idle_ns, windowed FROM watch_steps
                                    WHERE recording_id = ? AND rank = ? ORDER BY iteration""", [rid, rank]).fetchall()
            assert stored == sorted(zip(raw["iteration"], raw["step_ns"], raw["busy_ns"], raw["data_idle_ns"],
                                        raw["windowed"]))
        assert con.execute("SELECT DISTINCT host FROM watch_steps WHERE recording_id = ?", [rid]).fetchall() != [(None,)]
    finally:
        con.close()


def test_the_trigger_names_rank_2_and_its_row_points_at_the_ingested_window_run(slow, ingested):
    db, runs = ingested
    live = json.loads((slow / "watch" / "live.json").read_text())
    [trigger] = live["triggers"]
    assert (trigger["rule"], trigger["rank"]) == ("rank", 2)
    [run] = runs["slow"]["runs"]
    [watch] = runs["slow"]["watch"]
    assert watch["window_runs"] == [run["run_id"]] and watch["num_triggers"] == 1
    con = open_store(db, read_only=True)
    try:
        row = con.execute("""SELECT t.start_iteration, t.num_steps, t.reason, t.run_id, w.window_range, w.trigger_reason,
                                    json_extract_string(r.metadata, '$.window.window')
                             FROM watch_triggers t JOIN watch_windows w USING (recording_id, run_id) JOIN runs r USING (run_id)
                             WHERE t.recording_id = ?""", [watch["recording_id"]]).fetchone()
        window = f"{trigger['start']}:{trigger['start'] + trigger['steps']}"
        assert row == (trigger["start"], trigger["steps"], trigger["reason"], run["run_id"], window,
                       trigger["reason"], window)
        # the window's iterations are the rows marked windowed, on every rank
        windowed = con.execute("""SELECT DISTINCT iteration FROM watch_steps WHERE recording_id = ? AND windowed
                                  ORDER BY 1""", [watch["recording_id"]]).fetchall()
        assert [i for (i,) in windowed] == list(range(trigger["start"], trigger["start"] + trigger["steps"]))
        episodes = con.execute("SELECT rule, rank, triggered FROM watch_episodes WHERE recording_id = ? ORDER BY episode_index",
                               [watch["recording_id"]]).fetchall()
        assert episodes == [(e["rule"], e["rank"], e["triggered"]) for e in live["episodes"]]
        assert ("rank", 2, True) in episodes
    finally:
        con.close()


def test_a_clean_job_without_a_window_is_a_recording_with_no_run(clean, ingested):
    db, runs = ingested
    assert runs["clean"]["runs"] == []
    [watch] = runs["clean"]["watch"]
    assert (watch["num_ranks"], watch["num_iterations"], watch["num_rows"]) == (NUM_RANKS, STEPS - 1, NUM_RANKS * (STEPS - 1))
    assert watch["window_runs"] == [] and watch["num_triggers"] == 0 and watch["name"] == "watch-rec-2"
    con = open_store(db, read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM runs WHERE name LIKE 'watch-%'").fetchone()[0] == 0
    finally:
        con.close()
    said = bprof("ingest", clean, "--db", db.parent / "other.duckdb")
    assert said.returncode == 0 and "no window was captured" in said.stdout and "`bprof analyze watch-rec`" in said.stdout


def test_ingesting_again_changes_nothing(slow, clean, ingested):
    db, runs = ingested
    before = _counts(db)
    for path in (slow, clean):
        done = bprof("ingest", path, "--db", db)
        assert done.returncode == 0 and "already ingested" in done.stdout, done.stdout + done.stderr
    assert _counts(db) == before


def test_a_truncated_watch_file_is_named_and_the_store_is_left_as_it_was(slow, tmp_path):
    broken = tmp_path / "rec"
    shutil.copytree(slow, broken)
    victim = sorted((broken / "watch" / "rank1").glob("*.steps.parquet"))[3]
    victim.write_bytes(victim.read_bytes()[:200])
    db = tmp_path / "w.duckdb"
    open_store(db).close()
    before = _counts(db)
    done = bprof("ingest", broken, "--db", db)
    assert done.returncode == 3, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"bprof: error: {victim}: unreadable watch file")
    assert _counts(db) == before  # neither the window run nor the series went in


def test_a_damaged_live_json_is_named(slow, tmp_path):
    broken = tmp_path / "rec"
    shutil.copytree(slow, broken)
    (broken / "watch" / "live.json").write_text('{"triggers": [')
    done = bprof("ingest", broken, "--db", tmp_path / "w.duckdb")
    assert done.returncode == 3
    [line] = done.stderr.strip().splitlines()
    assert str(broken / "watch" / "live.json") in line and "unreadable live analysis file" in line


def _counts(db) -> dict:
    con = open_store(db, read_only=True)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("runs", "events", "watch_recordings", "watch_steps", "watch_triggers", "watch_windows",
                          "watch_episodes", "watch_scores")}
    finally:
        con.close()


def test_ddp_reducer_waits_are_blocked_time_in_its_group_on_the_ranks_that_wait(slow, ingested):
    """The program is DDP (C++ reducer): no collective is called from Python, yet the ranks that wait
    for the slow rank 2 from iteration 40 wait in the reducer at the end of backward."""
    db, _ = ingested
    con = open_store(db, read_only=True)
    try:
        rid = con.execute("SELECT recording_id FROM watch_recordings WHERE source_path = ?", [str(slow)]).fetchone()[0]
        groups = con.execute("SELECT DISTINCT pg_name, pg_desc FROM watch_groups WHERE recording_id = ?", [rid]).fetchall()
        assert groups == [("0", "default_pg")]  # DDP's process group: the default one
        median = dict(((rank, late), ns) for rank, late, ns in con.execute("""
            SELECT s.rank, s.iteration >= ? AS late, median(coalesce(g.blocked_ns, 0))
            FROM watch_steps s LEFT JOIN watch_groups g USING (recording_id, rank, attempt, iteration)
            WHERE s.recording_id = ? AND NOT s.windowed AND (s.iteration BETWEEN 5 AND ? OR s.iteration >= ?)
            GROUP BY ALL""", [SLOW_FROM, rid, SLOW_FROM - 1, SLOW_FROM + 5]).fetchall())
    finally:
        con.close()
    waiting = [r for r in range(NUM_RANKS) if r != SLOW_RANK]
    for rank in waiting:  # each waits about the slow rank's extra 30 ms more a step than before
        assert median[(rank, True)] - median[(rank, False)] >= 0.5 * SLOW_MS * 1e6, (rank, median)
    assert median[(SLOW_RANK, True)] < min(median[(r, True)] for r in waiting), median
