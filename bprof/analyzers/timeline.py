"""Which span of time is each rank's step, and what stands for its device (timeline_spans)?

Reads steps and events (reduced_spans for ranks ingested from `bprof reduce` output); writes
timeline_spans, which every other analyzer partitions, and timeline_threads, the host threads
(main and backward) that drive each rank. Says which views reduced ranks cannot have, and when the
device's queue grows (the host runs ahead: the step time is the device's, not the CPU ranges').
"""

from __future__ import annotations

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql
from bprof.store.ingest import rank_ranges

NAME = "timeline"
TABLES = ["timeline_spans", "timeline_threads"]
# A queue is said to grow when the device's lag behind the CPU ranges rose in most step-to-step
# transitions and by this share of the median device step per step on average: below it the lag
# is the usual launch-ahead of one step, which every asynchronous runtime shows.
QUEUE_GROWTH_MIN_FRAC = 0.02


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
    queue = queue_growth(con, run_id)
    if queue:
        result.findings.append(queue)
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


def queue_growth(con: duckdb.DuckDBPyConnection, run_id: int) -> Finding | None:
    """An info finding when the device lags the host more with every step (timeline_spans.device_lag_ns
    over consecutive device steps) on some rank: the host runs ahead, so the step time is the
    device's and the CPU ranges understate it; the rank with the fastest growth is named."""
    rows = con.execute("""
        SELECT rank, list(step ORDER BY step), list(device_lag_ns ORDER BY step), median(dur_ns),
            median(host_dur_ns)
        FROM timeline_spans WHERE run_id = ? AND step >= 0 AND device_lag_ns IS NOT NULL
        GROUP BY rank ORDER BY rank""", [run_id]).fetchall()
    growing = []
    for rank, steps, lags, step_ns, host_ns in rows:
        pairs = [(b - a) for (s, a), (t, b) in zip(zip(steps, lags), zip(steps[1:], lags[1:])) if t == s + 1]
        if not pairs or not step_ns:
            continue
        per_step_ns = sum(pairs) / len(pairs)
        if sum(d > 0 for d in pairs) * 2 > len(pairs) and per_step_ns >= QUEUE_GROWTH_MIN_FRAC * step_ns:
            growing.append((per_step_ns, rank, steps, lags, step_ns, host_ns))
    if not growing:
        return None
    per_step_ns, rank, steps, lags, step_ns, host_ns = max(growing)
    ranks = sorted(g[1] for g in growing)
    return Finding(
        "info",
        f"Device queue grows: the host runs {per_step_ns / 1e6:.2f} ms further ahead of the device every step "
        f"on rank {rank}",
        "Nothing to fix on the host: the device sets the pace, so look at its work (kernels, communication). "
        "The step time is the device's; the CPU step ranges understate it.",
        f"The device finished each step's work {lags[0] / 1e6:.2f} ms (step {steps[0]}) to {lags[-1] / 1e6:.2f} ms "
        f"(step {steps[-1]}) after the step's CPU range ended; the median step is {step_ns / 1e6:.2f} ms on the "
        f"device against {host_ns / 1e6:.2f} ms on the host. Steps are measured on the device "
        f"(timeline_spans.device_lag_ns); {len(ranks)} rank(s) show a growing queue.",
        None,
        {"ranks": ranks, "steps": list(steps), "rank": rank, "device_lag_ns": list(lags),
         "lag_growth_ns_per_step": int(per_step_ns), "device_step_ns": int(step_ns), "host_step_ns": int(host_ns)})
