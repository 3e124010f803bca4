"""Collective storms: many small collectives of one group and op in every step, each paying a whole
latency for a few bytes. Priced by the one engine (`bprof whatif -s coalesce-small`): the step with
each group's small collectives of a step sent as one.

Reads collectives, events, timeline_spans (and what the what-if graph reads); writes storms_groups
(definitions in storms.sql) and at most one finding: the scenario batches every storm at once.
"""

from __future__ import annotations

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql, severity_for
from bprof.whatif.run import saved_ns
from bprof.whatif.scenarios import SMALL_COLLECTIVE_BYTES

NAME = "storms"
TABLES = ["storms_groups"]
# Fewer small calls a step than this are a loss value or two logged: not worth batching.
MIN_CALLS = 8
SCENARIO = "coalesce-small"


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    result = Result(NAME, TABLES)
    run_sql(con, "storms.sql", run_id, {"max_bytes": SMALL_COLLECTIVE_BYTES, "min_calls": MIN_CALLS})
    rows = con.execute("""SELECT coalesce(pg_name, 'unnamed'), pg_desc, ranks, op, num_steps, calls_per_step,
                                 median_bytes, comm_ns_per_step
                          FROM storms_groups WHERE run_id = ? ORDER BY calls_per_step DESC, op, pg_name""", [run_id]).fetchall()
    if not rows:
        return result
    step_ns, all_ranks = con.execute("""
        WITH job AS (SELECT step, max(dur_ns) AS dur_ns FROM timeline_spans WHERE run_id = ? AND dur_ns > 0 GROUP BY step)
        SELECT (SELECT median(dur_ns) FROM job),
               (SELECT list(DISTINCT rank ORDER BY rank) FROM timeline_spans WHERE run_id = ?)""", [run_id, run_id]).fetchone()
    name, desc, ranks, op, steps, calls, size, comm_ns = rows[0]
    group = f"{name} ({desc})" if desc else name
    others = "".join(f"; {c:.0f} {o} a step on {n}" for n, _, _, o, _, c, _, _ in rows[1:])
    title = f"Collective storm: {calls:.0f} {op} calls of {size or 0:,} bytes back to back a step on group {group}{others}"
    evidence = {"ranks": sorted(ranks) if ranks else all_ranks, "group": name, "op": op, "calls_per_step": calls,
                "median_bytes": size, "comm_ns_per_step": comm_ns, "num_steps": steps, "scenario": SCENARIO}
    advice = ("Batch them: all-reduce one flattened tensor (torch.cat of the values, or a dict of metrics packed into "
              "one tensor) instead of one call per value, or log them every N steps.")
    priced, why = saved_ns(con, run_id, [SCENARIO])
    if SCENARIO not in priced:
        result.findings.append(not_measurable(title, f"The engine cannot price batching them: {why}.", advice, **evidence))
        return result
    lost_ns = max(int(priced[SCENARIO]), 0)
    result.findings.append(Finding(
        severity_for(lost_ns, step_ns or 0), title, advice,
        f"They take {(comm_ns or 0) / 1e6:.2f} ms a step (median over ranks and {steps} steps; each collective of at "
        f"most {SMALL_COLLECTIVE_BYTES:,} bytes pays a whole latency). Counterfactual (`bprof whatif -s {SCENARIO}`): "
        f"back-to-back small collectives of one group and op sent as one, the last keeping its transfer; their calls' "
        f"host time and any waiting for a late peer as measured. The step would be shorter by {lost_ns / 1e6:.2f} ms.",
        lost_ns, evidence))
    return result
