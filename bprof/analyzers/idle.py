"""Why is the device idle? Each idle gap of the breakdown, attributed to what the host was doing:
sync, gc, data_loading, launch_bound, host_other (definitions in idle.sql).

Reads breakdown_idle_gaps, timeline_spans, events; writes idle_causes, idle_gaps, idle_segments,
idle_ops; prices each cause with the what-if engine (bprof.whatif.run, nothing written there).
"""

from __future__ import annotations

import statistics

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql, severity_for
from bprof.whatif.run import saved_ns

NAME = "idle"
TABLES = ["idle_causes", "idle_gaps", "idle_segments", "idle_ops"]
CAUSES = ("sync", "gc", "data_loading", "launch_bound", "host_other")

_TITLE = {
    "sync": "{what} idle after host syncs",
    "gc": "{what} idle during Python garbage collection",
    "launch_bound": "{what} idle while the host dispatches ops and launches (launch-bound)",
    "host_other": "{what} idle while the host runs Python between ops",
}
_ADVICE = {
    "sync": "Remove host syncs from the step (.item(), .cpu(), .tolist(), torch.cuda.synchronize(), printing or "
            "logging tensors): log every N steps, keep metrics on the device, use non_blocking copies.",
    "gc": "Stop the Python collector from pausing steps: gc.freeze() after building the model, then gc.disable() "
          "with gc.collect() every N steps (as Megatron-LM and torchtitan do).",
    "launch_bound": "Launch fewer, larger kernels: CUDA graphs (torch.compile mode='reduce-overhead'), torch.compile "
                    "to fuse small ops, fused/foreach optimizers, larger micro-batches.",
    "host_other": "Shorten the Python between ops (py-spy shows where it goes): move logging and bookkeeping out of "
                  "the step, or compile the step with torch.compile.",
}


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "intervals.sql", run_id)
    run_sql(con, "idle.sql", run_id, {"top_n": options.top_n})
    return Result(NAME, TABLES, _findings(con, run_id))


def _findings(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    """One finding per cause, on the rank where that cause's idle is largest (median per step, steps
    without it count as 0). lost_ns is the engine's counterfactual (bprof whatif -s
    no-host-gaps:CAUSE): that cause's gaps removed on every rank, how much shorter the job's step
    gets (median over steps) - which is not the idle time itself where the idle rank then waits for
    another (a pipeline stage waiting for its upstream stage gains nothing). data_loading has no
    finding here: phases reports it as data wait, with its noise rule."""
    # reduced ranks (`bprof reduce` output) have no events, so no idle attribution
    spans = con.execute("""SELECT rank, step, dur_ns, timeline FROM timeline_spans WHERE run_id = ? AND dur_ns > 0
                           AND rank NOT IN (SELECT rank FROM reduced_ranks WHERE run_id = ?)""",
                        [run_id, run_id]).fetchall()
    if not spans:
        return []
    causes = {(r, s, c): (ns, n) for r, s, c, ns, n in con.execute(
        "SELECT rank, step, cause, dur_ns, num_gaps FROM idle_causes WHERE run_id = ?", [run_id]).fetchall()}
    steps_of: dict[int, list[int]] = {}
    for rank, step, _, _ in spans:
        steps_of.setdefault(rank, []).append(step)
    span_ns = {(r, s): d for r, s, d, _ in spans}
    on_cpu = all(t == "main_thread" for *_, t in spans)
    what = "Training thread" if on_cpu else "Device"
    findings = []
    found = {}
    for cause in CAUSES:
        if cause == "data_loading":
            continue
        medians = {r: statistics.median(causes.get((r, s, cause), (0, 0))[0] for s in ss) for r, ss in steps_of.items()}
        worst = max(medians, key=lambda r: (medians[r], -r))
        if medians[worst] > 0:
            found[cause] = (medians, worst)
    priced, why = saved_ns(con, run_id, [f"no-host-gaps:{c}" for c in found])
    saved = {c: priced[f"no-host-gaps:{c}"] for c in found if f"no-host-gaps:{c}" in priced}
    for cause, (medians, worst) in found.items():
        idle_ns = int(medians[worst])
        steps = sorted(steps_of[worst])
        step_ns = statistics.median(span_ns[(worst, s)] for s in steps)
        num_gaps = sum(causes.get((worst, s, cause), (0, 0))[1] for s in steps)
        top = con.execute("""
            SELECT step, ts_ns, dur_ns FROM idle_gaps WHERE run_id = ? AND rank = ? AND main_cause = ?
            ORDER BY dur_ns DESC, ts_ns LIMIT 3""", [run_id, worst, cause]).fetchall()
        ops = con.execute("""
            SELECT name, dur_ns FROM idle_ops WHERE run_id = ? AND rank = ? AND cause = ?
            ORDER BY dur_ns DESC, name LIMIT 3""", [run_id, worst, cause]).fetchall()
        held = "; inside " + ", ".join(f"{n} ({d / 1e6 / len(steps):.2f} ms per step)" for n, d in ops) if ops else ""
        title = _TITLE[cause].format(what=what)
        if cause == "host_other" and on_cpu:
            title = "Training thread in Python between ops"
        headline = f"{title}: {idle_ns / 1e6:.2f} ms per step on rank {worst} ({idle_ns / step_ns:.0%} of the step)"
        measured = (f"{idle_ns / 1e6:.2f} ms idle per step on rank {worst} (median over steps; {num_gaps} gaps over "
                    f"{len(steps)} steps{held})")
        evidence = {"ranks": [worst], "steps": steps, "cause": cause, "idle_ns": idle_ns,
                    "ns_by_rank": {str(r): int(medians[r]) for r in sorted(medians)},
                    "largest_gaps": [{"step": s, "ts_ns": t, "dur_ns": d} for s, t, d in top],
                    "ops": [{"name": n, "dur_ns": d} for n, d in ops]}
        if cause not in saved:
            findings.append(not_measurable(headline, f"{measured}; what removing it buys is not measurable: {why}",
                                           _ADVICE[cause], **evidence))
            continue
        lost_ns = max(saved[cause], 0)
        if lost_ns < idle_ns:
            headline += f"; removing it buys {lost_ns / 1e6:.2f} ms"
        findings.append(Finding(
            severity_for(lost_ns, step_ns) if lost_ns > 0 else "info", headline, _ADVICE[cause],
            f"Counterfactual (bprof whatif -s no-host-gaps:{cause}): the idle gaps caused by {cause} (idle.sql) "
            f"removed on every rank, the job's step would be {lost_ns / 1e6:.2f} ms shorter (median over steps); "
            f"measured: {measured}." + ("" if lost_ns >= idle_ns else
                                         " Less than the idle time: where the gaps go, the rank then waits for a peer."),
            lost_ns, evidence))
    return findings

