"""The schema documents itself, is versioned, and refuses stores from a newer bprof."""

from __future__ import annotations

import duckdb
import pytest

from bprof.errors import DataError, UsageError
from bprof.store.db import SCHEMA_VERSION, open_store


def test_every_table_and_column_has_a_comment(store):
    undocumented = store.execute("""
        SELECT table_name || '.' || column_name FROM duckdb_columns()
        WHERE schema_name = 'main' AND NOT internal AND (comment IS NULL OR comment = '')""").fetchall()
    assert undocumented == []
    bare_tables = store.execute("""
        SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' AND (comment IS NULL OR comment = '')""").fetchall()
    assert bare_tables == []


def test_core_tables_exist(store):
    tables = {r[0] for r in store.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert {"meta", "runs", "ranks", "events", "collectives", "steps", "metrics", "step_metrics", "findings"} <= tables
    rank_columns = {r[0] for r in store.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = 'ranks'").fetchall()}
    assert {"host", "clock_offset_ns", "clock_residual_ns"} <= rank_columns


def test_times_are_int64_ns(store):
    wrong = store.execute("""
        SELECT table_name || '.' || column_name || ' ' || data_type FROM duckdb_columns()
        WHERE (column_name LIKE '%\\_ns' ESCAPE '\\') AND data_type <> 'BIGINT'""").fetchall()
    assert wrong == []


def test_reopen_keeps_data_and_version(tmp_path):
    path = tmp_path / "s.duckdb"
    con = open_store(path)
    con.execute("INSERT INTO metrics VALUES (1, 'x', 1.0, 'count', 'test')")
    con.close()
    con = open_store(path, read_only=True)
    assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    assert con.execute("SELECT count(*) FROM metrics").fetchone()[0] == 1
    con.close()


def test_newer_schema_is_refused_clearly(tmp_path):
    path = tmp_path / "future.duckdb"
    open_store(path).close()
    con = duckdb.connect(str(path))
    con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION + 1)])
    con.close()
    with pytest.raises(DataError, match=rf"written by a newer bprof \(schema {SCHEMA_VERSION + 1}; this bprof reads up to {SCHEMA_VERSION}\)"):
        open_store(path)


def test_not_a_store(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (x INTEGER)")
    con.close()
    with pytest.raises(DataError, match="not a bprof store"):
        open_store(path, read_only=True)
    with pytest.raises(UsageError, match="no bprof store here"):
        open_store(tmp_path / "missing.duckdb", read_only=True)
    (tmp_path / "garbage.duckdb").write_bytes(b"not a database at all" * 100)
    with pytest.raises(DataError, match="cannot open as a DuckDB store"):
        open_store(tmp_path / "garbage.duckdb")
