"""Which span of time is each rank's step, and what stands for its device (timeline_spans)?

Reads steps and events (reduced_spans for ranks ingested from `bprof reduce` output); writes
timeline_spans, which every other analyzer partitions, and timeline_threads, the host threads
(main and backward) that drive each rank. Says which views reduced ranks cannot have.
"""

from __future__ import annotations

import duckdb

from bprof.analyzers.base import Options, Result, not_measurable, run_sql
from bprof.store.ingest import rank_ranges

NAME = "timeline"
TABLES = ["timeline_spans", "timeline_threads"]


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "timeline.sql", run_id)
    result = Result(NAME, TABLES)
    no_steps = [r for (r,) in con.execute(
        "SELECT rank FROM timeline_spans WHERE run_id = ? AND step = -1 ORDER BY rank", [run_id]).fetchall()]
    if no_steps:
        result.findings.append(not_measurable(
            "No ProfilerStep ranges: per-step analysis is not possible",
            f"{len(no_steps)} rank(s) have no ProfilerStep#N range; their whole trace is analysed as one span (step -1).",
            "Record with `bprof record` (it marks optimizer steps), or call prof.step() every iteration.",
            ranks=no_steps))
    reduced = [r for (r,) in con.execute("SELECT rank FROM reduced_ranks WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()]
    if reduced:
        result.findings.append(not_measurable(
            f"Kernels, phases, idle causes, launch, memory and HFU are not available for {len(reduced)} reduced rank(s)",
            f"Rank(s) {rank_ranges(reduced)} were ingested from `bprof reduce` outputs: their steps, collectives, clock "
            "samples and per-step partition are here, so cross-rank analysis covers them, but not their events, "
            "which those views need.",
            "Ingest these ranks' traces (bprof reduce leaves each trace beside its rank<R>.reduced) for those views.",
            ranks=reduced))
    return result
