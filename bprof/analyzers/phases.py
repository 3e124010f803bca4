"""Which phase of the training step is each rank in, and for how long: data wait, forward,
backward, recompute, optimizer, other (definitions in phases.sql); and does waiting for data cost
more than the run's noise?

Reads timeline_spans, events; writes phases_steps, phases_ranks.
"""

from __future__ import annotations

import statistics

import duckdb

from bprof.analyzers.base import Finding, Options, Result, run_sql, severity_for
from bprof.whatif.run import saved_ns

NAME = "phases"
TABLES = ["phases_steps", "phases_ranks"]
# A data wait under this share of the step is not reported: it is below what severity_for calls a
# warning, and on shared machines step times move by about that much from run to run.
MIN_WAIT_FRAC = 0.02


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "intervals.sql", run_id)
    run_sql(con, "phases.sql", run_id)
    result = Result(NAME, TABLES)
    finding = data_wait_finding(con, run_id)
    if finding:
        result.findings.append(finding)
    return result


def data_wait_finding(con: duckdb.DuckDBPyConnection, run_id: int) -> Finding | None:
    """The data-wait finding, or None when the wait is within the run's noise.

    Counterfactual: batches are ready the instant they are asked for, so each step is shorter by
    its exposed data wait: the whole wait on CPU traces (the training thread is the timeline), the
    part of it with the device idle on GPU traces (loading that overlaps device work costs nothing).
    lost_ns = the median over steps of that wait on the rank where it is largest.

    Noise rule: the fixed run's steps would take span - wait; the spread of those residual step
    times (max - min over a rank's steps, the median of that over ranks) is what step time varies
    by anyway. A wait no larger than that spread could not be confirmed by rerunning with the fix,
    so it is not reported; nor is a wait under MIN_WAIT_FRAC of the step. With one step per rank
    the spread is unknown and only the MIN_WAIT_FRAC floor applies.
    """
    rows = con.execute("""
        SELECT p.rank, p.step, s.dur_ns AS span_ns, s.timeline,
            CASE WHEN s.timeline = 'device' THEN p.device_idle_ns ELSE p.dur_ns END AS wait_ns, p.dur_ns
        FROM phases_steps p JOIN timeline_spans s ON s.run_id = p.run_id AND s.rank = p.rank AND s.step = p.step
        WHERE p.run_id = ? AND p.phase = 'data_wait'
        ORDER BY p.rank, p.step""", [run_id]).fetchall()
    by_rank: dict[int, list[tuple]] = {}
    for row in rows:
        by_rank.setdefault(row[0], []).append(row)
    if not by_rank:
        return None
    waits = {r: statistics.median(x[4] for x in rs) for r, rs in by_rank.items()}
    spreads = [max(x[2] - x[4] for x in rs) - min(x[2] - x[4] for x in rs) for rs in by_rank.values() if len(rs) > 1]
    noise_ns = statistics.median(spreads) if spreads else 0
    worst = max(waits, key=lambda r: (waits[r], -r))
    lost_ns = int(waits[worst])
    step_ns = statistics.median(x[2] for x in by_rank[worst])
    noise_ns = max(noise_ns, MIN_WAIT_FRAC * step_ns)
    if lost_ns <= noise_ns:
        return None
    on_device = by_rank[worst][0][3] == "device"
    ranks = sorted((r for r in waits if waits[r] > noise_ns), key=lambda r: (-waits[r], r))
    steps = sorted({x[1] for r in ranks for x in by_rank[r] if x[4] > 0})
    exposed = "with the device idle " if on_device else ""
    title = f"Waiting for data: {lost_ns / 1e6:.2f} ms per step on rank {worst} ({lost_ns / step_ns:.0%} of the step)"
    wait_ns = lost_ns
    saved = saved_ns(con, run_id, ["no-host-gaps:data_loading"])[0].get("no-host-gaps:data_loading")
    priced = ""
    if saved is not None:
        # the one engine's answer: the data loading gone on every rank, the job's step
        lost_ns = max(saved, 0)
        priced = (f" Priced by the what-if engine (bprof whatif -s no-host-gaps:data_loading): the data loading gone "
                  f"on every rank, the job's step would be {lost_ns / 1e6:.2f} ms shorter (median over steps).")
        if lost_ns < wait_ns:
            title += f"; removing it buys {lost_ns / 1e6:.2f} ms"
    return Finding(
        severity_for(lost_ns, step_ns),
        title,
        "Load batches ahead of the step: DataLoader(num_workers>0, pin_memory=True, prefetch_factor), "
        "move decoding/tokenisation out of the training loop, or prefetch the next batch to the device.",
        f"Counterfactual: batches ready the instant they are asked for; the step would be shorter by the time the "
        f"host waits for data {exposed}(median over steps on rank {worst}). The run's noise (the spread of "
        f"step time without that wait, at least {MIN_WAIT_FRAC:.0%} of the step) is {noise_ns / 1e6:.2f} ms; "
        f"ranks above it: {ranks}.{priced}",
        lost_ns,
        {"ranks": ranks, "steps": steps, "noise_ns": int(noise_ns), "wait_ns": int(wait_ns),
         "wait_ns_by_rank": {str(r): int(waits[r]) for r in sorted(waits)}})

