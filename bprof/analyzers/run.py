"""Run every analyzer over one run, in one transaction, and read back what `bprof analyze` shows.

Analysis is idempotent: each analyzer first deletes the run's rows from its tables, and a failure
rolls the whole analysis back, leaving the store as it was.
"""

from __future__ import annotations

import hashlib
import importlib
from importlib import resources
from typing import Callable

import duckdb

from bprof.analyzers import invariants
from bprof.analyzers.base import Options, Result, replace_rows, table_exists, write_findings

# Order matters: later analyzers read the tables of earlier ones (timeline_spans first).
# phases after idle: the data-wait finding is priced with the idle analysis's idle_segments.
ANALYZERS = ["timeline", "match", "clock", "collperf", "breakdown", "kernels", "idle", "phases", "storms", "launch", "memory",
             "bubbles", "stragglers", "metrics", "joint"]
HTA_COMPAT = "hta_compat"


def analyze_run(con: duckdb.DuckDBPyConnection, run_id: int, options: Options = Options(),
                progress: Callable[[str], None] | None = None) -> list[Result]:
    names = ANALYZERS + ([HTA_COMPAT] if options.hta_compat else [])
    modules = [importlib.import_module(f"bprof.analyzers.{name}") for name in names]
    results = []
    con.execute("BEGIN TRANSACTION")
    try:
        _drop_stale_tables(con)
        for module in modules:
            if progress:
                progress(module.NAME)
            replace_rows(con, module.TABLES, run_id)
            result = module.analyze(con, run_id, options)
            result.findings = invariants.bounded(result.findings, invariants.step_ns_by_rank(con, run_id))
            write_findings(con, run_id, module.NAME, result.findings)
            results.append(result)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return results


def _drop_stale_tables(con: duckdb.DuckDBPyConnection) -> None:
    """Derived tables are created with IF NOT EXISTS; when this bprof's analyzer SQL differs from the
    one that created them, drop them all (every run's derived rows: they are recomputed by analysing
    again, while the store's own tables stay untouched)."""
    digest = _analysis_digest()
    row = con.execute("SELECT value FROM meta WHERE key = 'analysis_sql'").fetchone()
    if row and row[0] == digest:
        return
    for name in ANALYZERS + [HTA_COMPAT]:
        for table in importlib.import_module(f"bprof.analyzers.{name}").TABLES:
            if table not in ("metrics", "step_metrics"):
                # names come from the analyzers' own constants, never from user input
                con.execute(f"DROP TABLE IF EXISTS {table}")
    con.execute("DELETE FROM meta WHERE key = 'analysis_sql'")
    con.execute("INSERT INTO meta VALUES ('analysis_sql', ?)", [digest])


def _analysis_digest() -> str:
    """sha256 over every analyzer SQL file: a change in any may change a derived table."""
    h = hashlib.sha256()
    for f in sorted(resources.files("bprof.analyzers").iterdir(), key=lambda f: f.name):
        if f.name.endswith(".sql"):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def summary(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """What analysis found for a run, as plain data (the CLI prints it; --json dumps it)."""
    def rows(sql: str, *params) -> list[dict]:
        cur = con.execute(sql, [run_id, *params])
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    out = {
        "run": rows("SELECT run_id, name, world_size, num_ranks_ingested, device_name, backend FROM runs WHERE run_id = ?")[0],
        "metrics": {r["name"]: {"value": r["value"], "unit": r["unit"]}
                    for r in rows("SELECT name, value, unit FROM metrics WHERE run_id = ? ORDER BY name")},
        "ranks": rows("""SELECT rank, timeline, num_steps, median_step_ns, compute_frac, exposed_comm_frac,
                                overlapped_comm_frac, memcpy_frac, idle_frac, other_frac, comm_overlap_frac
                         FROM breakdown_ranks WHERE run_id = ? ORDER BY rank"""),
        "findings": [
            {**f, "evidence": _json(f["evidence"])}
            for f in rows("""SELECT analyzer, severity, lost_ns, title, detail, evidence FROM findings
                             WHERE run_id = ? ORDER BY lost_ns DESC NULLS LAST, severity, finding_id""")
        ],
    }
    for f in out["findings"]:
        f["advice"] = f["evidence"].pop("advice", None)
    if table_exists(con, "kernels_classes"):
        out["kernel_classes"] = rows("""
            SELECT fine_class, sum(num_events) AS num_events, sum(num_graph_kernels) AS num_graph_kernels,
                   sum(dur_ns) AS dur_ns, sum(dur_ns) / sum(sum(dur_ns)) OVER () AS share_frac
            FROM kernels_classes WHERE run_id = ? GROUP BY fine_class ORDER BY dur_ns DESC""")
        out["matmul_by_dtype"] = rows("""
            SELECT coalesce(dtype, 'unknown') AS dtype, sum(dur_ns) AS dur_ns, sum(flops) AS flops,
                   sum(dur_ns) / sum(sum(dur_ns)) OVER () AS share_frac
            FROM kernels_ops WHERE run_id = ? GROUP BY ALL ORDER BY dur_ns DESC""")
    if table_exists(con, "phases_ranks"):
        out["phases"] = rows("SELECT * EXCLUDE (run_id) FROM phases_ranks WHERE run_id = ? ORDER BY rank, phase")
    if table_exists(con, "clock_hosts"):
        out["clock_hosts"] = rows("SELECT host, offset_ns, residual_ns, method FROM clock_hosts WHERE run_id = ? ORDER BY host")
    if table_exists(con, "stragglers_ranks"):
        out["stragglers"] = rows("""SELECT rank, host, lost_ns, cause, last_frac, imposed_wait_ns, score
                                    FROM stragglers_ranks WHERE run_id = ? AND flagged ORDER BY lost_ns DESC""")
    if table_exists(con, "bubbles_runs"):
        out["pipeline"] = rows("SELECT * EXCLUDE (run_id) FROM bubbles_runs WHERE run_id = ?")
    if table_exists(con, "hta_compat_ranks"):
        hta = {r["rank"]: r for r in rows("SELECT * EXCLUDE (run_id) FROM hta_compat_ranks WHERE run_id = ?")}
        for r in out["ranks"]:
            if r["rank"] in hta:
                r["hta"] = {k: v for k, v in hta[r["rank"]].items() if k != "rank"}
    return out


def _json(text):
    import json

    return json.loads(text) if text else {}
