"""Every table an analyzer creates documents itself, keeps its times as int64 ns, and only its own
names (`<analyzer>_*`); the whole analysis is one transaction that a failure rolls back."""

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from tests.analyzers.tables import tiny_store

STORE_TABLES = {"meta", "runs", "ranks", "events", "collectives", "steps", "clock_samples", "metrics",
                "step_metrics", "findings", "device_peaks", "reduced_ranks", "reduced_spans", "reduced_breakdown",
                "reduced_exposed_comm", "reduced_dims", "ci_runs", "ci_metrics", "ci_components", "replays", "whatif",
                "whatif_runs", "exec_nodes", "hangs", "watch_recordings", "watch_steps", "watch_groups", "watch_windows",
                "watch_triggers", "watch_episodes", "watch_scores"}


@pytest.fixture
def analysed(tmp_path):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 10, "dur_ns": 30, "step": 1}])
    analysis.analyze_run(con, run_id, Options(hta_compat=True))
    return con, run_id


def test_every_analyzer_table_and_column_has_a_comment_and_ns_are_bigint(analysed):
    con, _ = analysed
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    derived = tables - STORE_TABLES
    assert len(derived) >= 10
    bare = con.execute("""SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND (comment IS NULL OR comment = '')""").fetchall()
    undocumented = con.execute("""
        SELECT table_name || '.' || column_name FROM duckdb_columns()
        WHERE NOT internal AND database_name = current_database() AND schema_name = 'main'
          AND (comment IS NULL OR comment = '')""").fetchall()
    wrong = con.execute("""
        SELECT table_name || '.' || column_name || ' ' || data_type FROM duckdb_columns()
        WHERE database_name = current_database() AND schema_name = 'main' AND column_name LIKE '%\\_ns' ESCAPE '\\' AND data_type <> 'BIGINT'""").fetchall()
    assert (bare, undocumented, wrong) == ([], [], [])
    names = {m: __import__(f"bprof.analyzers.{m}", fromlist=["TABLES"]).TABLES for m in analysis.ANALYZERS + [analysis.HTA_COMPAT]}
    for module, owned in names.items():
        for table in owned:
            assert table.startswith(module + "_") or table in ("metrics", "step_metrics"), (module, table)
    assert derived <= {t for owned in names.values() for t in owned}, derived - {t for owned in names.values() for t in owned}


def test_a_failing_analyzer_rolls_the_whole_analysis_back(analysed, monkeypatch):
    con, run_id = analysed
    before = con.execute("SELECT count(*), sum(compute_ns) FROM breakdown_steps").fetchone()
    findings = con.execute("SELECT count(*) FROM findings").fetchone()[0]
    from bprof.analyzers import metrics

    def boom(*args):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(metrics, "analyze", boom)
    with pytest.raises(RuntimeError):
        analysis.analyze_run(con, run_id, Options())
    assert con.execute("SELECT count(*), sum(compute_ns) FROM breakdown_steps").fetchone() == before
    assert con.execute("SELECT count(*) FROM findings").fetchone()[0] == findings


def test_derived_tables_of_an_older_analysis_are_dropped_and_rebuilt(analysed):
    con, run_id = analysed
    con.execute("ALTER TABLE breakdown_ranks DROP COLUMN comm_overlap_frac")  # as an older bprof made it
    con.execute("UPDATE meta SET value = 'older' WHERE key = 'analysis_sql'")
    analysis.analyze_run(con, run_id, Options())
    columns = {c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'breakdown_ranks'").fetchall()}
    assert "comm_overlap_frac" in columns
    assert con.execute("SELECT count(*) FROM breakdown_ranks WHERE run_id = ?", [run_id]).fetchone()[0] == 1
