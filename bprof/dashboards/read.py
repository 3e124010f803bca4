"""Reading the store for the report: plain rows and frames, every value bound as a parameter.

The report computes nothing of its own: it reads the tables the analyzers wrote. A run that was
ingested but not analysed lacks them; `has_table` lets a page say so instead of failing.
"""

from __future__ import annotations

import re

import duckdb
import pandas as pd


def rows(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def frame(con: duckdb.DuckDBPyConnection, sql: str, params: list | dict | None = None) -> pd.DataFrame:
    return con.execute(sql, params or []).df()


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [name]).fetchone()[0] > 0


def is_analysed(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """True once `bprof analyze` wrote the run's metrics."""
    return con.execute("SELECT count(*) FROM metrics WHERE run_id = ?", [run_id]).fetchone()[0] > 0


def metrics(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[str, float | None]:
    return dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ?", [run_id]).fetchall())


def run_info(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    return rows(con, """SELECT run_id, name, CAST(started_at AS VARCHAR) AS started_at, command, git_sha, world_size,
                               num_ranks_ingested, missing_ranks, backend, device_name
                        FROM runs WHERE run_id = ?""", [run_id])[0]


def run_ids(con: duckdb.DuckDBPyConnection) -> list[tuple[int, str]]:
    """(run_id, name), newest first."""
    return con.execute("SELECT run_id, name FROM runs ORDER BY run_id DESC").fetchall()


def steps(con: duckdb.DuckDBPyConnection, run_id: int) -> list[int]:
    """Steps captured on every ingested rank of the run, in order."""
    return [s for (s,) in con.execute("""
        SELECT step FROM steps WHERE run_id = ? GROUP BY step
        HAVING count(DISTINCT rank) = (SELECT count(DISTINCT rank) FROM steps WHERE run_id = ?)
        ORDER BY step""", [run_id, run_id]).fetchall()]


def rank_choices(con: duckdb.DuckDBPyConnection, run_id: int, chosen: list[int], typed: str,
                 limit: int) -> list[tuple[int, str | None]]:
    """(rank, host) for a rank picker: the chosen ranks, then up to `limit` others matching what the
    reader typed: a rank number's first digits and/or part of a host name, as the picker labels them
    ("12", "node3", "12 (node3)"); all ranks in order when nothing is typed."""
    m = re.fullmatch(r"\s*(\d*)\s*\(?\s*([^()]*?)\s*\)?\s*", typed)
    digits, host = m.groups() if m else ("", typed.strip())
    return con.execute("""
        SELECT rank, host FROM ranks WHERE run_id = $run_id AND list_contains($chosen, rank)
        UNION ALL
        (SELECT rank, host FROM ranks
         WHERE run_id = $run_id AND NOT list_contains($chosen, rank)
           AND starts_with(CAST(rank AS VARCHAR), $digits) AND contains(coalesce(host, ''), $host)
         ORDER BY rank LIMIT $limit)""", {"run_id": run_id, "chosen": chosen, "digits": digits, "host": host,
                                           "limit": limit}).fetchall()


def findings(con: duckdb.DuckDBPyConnection, run_id: int) -> list[dict]:
    """Findings in `bprof analyze`'s order: by lost_ns, largest first."""
    return rows(con, """SELECT finding_id, analyzer, severity, lost_ns, title, detail, evidence FROM findings
                        WHERE run_id = ? ORDER BY lost_ns DESC NULLS LAST, severity, finding_id""", [run_id])
