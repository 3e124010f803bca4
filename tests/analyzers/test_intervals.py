"""The generic interval macros on tiny tables with exact expected rows."""

import duckdb
import pytest

from bprof.store.sqlfile import run_sql_file


@pytest.fixture
def con():
    con = duckdb.connect()
    run_sql_file(con, "bprof.analyzers", "intervals.sql")
    return con


def _table(con, rows):
    con.execute("CREATE OR REPLACE TEMP TABLE t (key INTEGER, cls INTEGER, ts_ns BIGINT, end_ns BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)


def test_coverage_counts_overlaps_of_one_class_once_and_masks_combinations(con):
    _table(con, [(1, 0, 0, 10), (1, 0, 5, 20), (1, 1, 15, 30), (2, 3, 100, 110)])
    got = con.execute("SELECT key, mask, dur_ns FROM iv_coverage('t') ORDER BY key, mask").fetchall()
    assert got == [(1, 1, 15), (1, 2, 10), (1, 3, 5), (2, 8, 10)]


def test_segments_tile_without_gaps_where_a_class_is_active(con):
    _table(con, [(1, 7, 0, 100), (1, 0, 10, 20), (1, 0, 20, 30), (1, 2, 25, 40)])
    got = con.execute("SELECT ts_ns, end_ns, mask FROM iv_segments('t') ORDER BY ts_ns").fetchall()
    assert got == [(0, 10, 128), (10, 20, 129), (20, 25, 129), (25, 30, 133), (30, 40, 132), (40, 100, 128)]
    assert sum(e - s for s, e, _ in got) == 100


def test_zero_length_intervals_are_ignored(con):
    _table(con, [(1, 0, 5, 5), (1, 1, 0, 3)])
    assert con.execute("SELECT mask, dur_ns FROM iv_coverage('t')").fetchall() == [(2, 3)]


def test_union_merges_overlapping_and_touching_intervals(con):
    _table(con, [(1, 0, 0, 10), (1, 5, 5, 12), (1, 0, 12, 15), (1, 0, 20, 25), (1, 0, 21, 22), (2, 0, 0, 1)])
    got = con.execute("SELECT key, ts_ns, end_ns FROM iv_union('t') ORDER BY key, ts_ns").fetchall()
    assert got == [(1, 0, 15), (1, 20, 25), (2, 0, 1)]
