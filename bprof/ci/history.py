"""The CI history: run summaries kept in the ci_* tables of a store (the run's own --db, or a small
dedicated --history file that CI keeps as an artifact; it needs no traces).

Reads and writes ci_runs, ci_metrics, ci_components (schema.sql documents their columns).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

import duckdb

from bprof.ci.summary import MetricSummary, RunSummary
from bprof.errors import UsageError


@dataclass(frozen=True)
class Entry:
    history_id: int
    series: str
    summary: RunSummary


def save(con: duckdb.DuckDBPyConnection, summary: RunSummary, series: str, source_db: str | None) -> tuple[int, bool]:
    """Add a run to `series`; (history_id, created). A run already in the series is left as it is."""
    row = con.execute("SELECT history_id FROM ci_runs WHERE series = ? AND fingerprint = ?",
                      [series, summary.fingerprint]).fetchone()
    if row:
        return row[0], False
    con.execute("BEGIN TRANSACTION")
    try:
        history_id = con.execute("""
            INSERT INTO ci_runs (series, run_name, fingerprint, source_db, benchmark, git_sha, git_branch, tags,
                                 started_at, recorded_at, facts, critical_rank, critical_rank_frac)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, CAST(? AS TIMESTAMPTZ), ?, ?, ?, ?) RETURNING history_id""",
            [series, summary.run_name, summary.fingerprint, source_db, summary.benchmark, summary.git_sha,
             summary.git_branch, summary.tags, summary.started_at, datetime.now(timezone.utc),
             json.dumps(summary.facts), summary.critical_rank, summary.critical_rank_frac]).fetchone()[0]
        con.executemany("INSERT INTO ci_metrics VALUES (?, ?, ?, ?, ?, ?, ?, ?)", [
            [history_id, metric, m.value, m.unit, m.num_steps, m.excluded_steps, m.step_spread_frac, m.not_measurable]
            for metric, m in summary.metrics.items()])
        if summary.components:
            con.executemany("INSERT INTO ci_components VALUES (?, ?, ?, ?)",
                            [[history_id, f, n, v] for (f, n), v in summary.components.items()])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return history_id, True


def series_names(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in con.execute("SELECT DISTINCT series FROM ci_runs ORDER BY 1").fetchall()]


def load_series(con: duckdb.DuckDBPyConnection, series: str, benchmark: str | None,
                up_to_history_id: int | None = None) -> list[Entry]:
    """The runs of `series` and `benchmark` (None matches runs without one), oldest first."""
    rows = con.execute("""
        SELECT history_id, series, run_name, fingerprint, benchmark, git_sha, git_branch, tags,
               CAST(started_at AS VARCHAR), facts, critical_rank, critical_rank_frac
        FROM ci_runs
        WHERE series = $series AND benchmark IS NOT DISTINCT FROM $benchmark
          AND ($up_to IS NULL OR history_id <= $up_to)
        ORDER BY history_id""", {"series": series, "benchmark": benchmark, "up_to": up_to_history_id}).fetchall()
    if not rows:
        return []
    ids = [r[0] for r in rows]
    metrics: dict[int, dict[str, MetricSummary]] = {}
    for hid, metric, value, unit, num_steps, excluded, spread, why in con.execute("""
            SELECT history_id, metric, value, unit, num_steps, excluded_steps, step_spread_frac, not_measurable
            FROM ci_metrics WHERE list_contains($ids, history_id)""", {"ids": ids}).fetchall():
        metrics.setdefault(hid, {})[metric] = MetricSummary(value, unit, num_steps, list(excluded), spread, why)
    components: dict[int, dict] = {}
    for hid, family, name, value_ns in con.execute(
            "SELECT history_id, family, name, value_ns FROM ci_components WHERE list_contains($ids, history_id)",
            {"ids": ids}).fetchall():
        components.setdefault(hid, {})[(family, name)] = value_ns
    out = []
    for hid, ser, name, fp, bench, sha, branch, tags, started, facts, crit, crit_frac in rows:
        summary = RunSummary(name, fp, bench, sha, branch, list(tags or []), started, json.loads(facts),
                             metrics.get(hid, {}), components.get(hid, {}), crit, crit_frac)
        out.append(Entry(hid, ser, summary))
    return out


def resolve_baseline(con: duckdb.DuckDBPyConnection, baseline: str, benchmark: str | None) -> tuple[str, list[Entry]]:
    """--baseline: a series name (its runs of `benchmark`), or a run's name in the history (its series up
    to that run, of that run's benchmark); (series name, entries oldest first)."""
    if baseline in series_names(con):
        return baseline, load_series(con, baseline, benchmark)
    row = con.execute("SELECT history_id, series, benchmark FROM ci_runs WHERE run_name = ? ORDER BY history_id DESC LIMIT 1",
                      [baseline]).fetchone()
    if row is None:
        known = ", ".join(series_names(con)) or "none yet"
        raise UsageError(f"no baseline series or run {baseline!r} in the history (series: {known}; "
                         f"add runs with `bprof ci record RUN --branch {baseline}`)")
    history_id, series, run_benchmark = row
    return series, load_series(con, series, run_benchmark, up_to_history_id=history_id)
