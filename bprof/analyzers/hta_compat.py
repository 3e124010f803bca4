"""What would HolisticTraceAnalysis 0.5.0 report per rank? Its temporal breakdown and comm-compute
overlap over its own window and with its own definitions, for parity checks only (`--hta-compat`).

Reads events and ranks; writes hta_compat_ranks (definitions, and how they differ from bprof's own
breakdown, in hta_compat.sql).
"""

from __future__ import annotations

import duckdb

from bprof.analyzers.base import Options, Result, not_measurable, run_sql

NAME = "hta_compat"
TABLES = ["hta_compat_ranks"]


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "intervals.sql", run_id)
    run_sql(con, "hta_compat.sql", run_id)
    result = Result(NAME, TABLES)
    missing = [r for (r,) in con.execute(
        """SELECT rank FROM ranks WHERE run_id = ?
           AND rank NOT IN (SELECT rank FROM hta_compat_ranks WHERE run_id = ?) ORDER BY rank""",
        [run_id, run_id]).fetchall()]
    if missing:
        result.findings.append(not_measurable(
            "HTA-compatible breakdown not measurable: no GPU events in HTA's window",
            f"{len(missing)} rank(s) have no kernel, memcpy or memset that HTA 0.5.0 would measure (a CPU-only "
            "trace, or every kernel launched in the last ProfilerStep, which HTA drops).",
            "Compare with HTA only on GPU traces that span more than one profiler step.",
            ranks=missing))
    return result
