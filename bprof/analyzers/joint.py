"""What would fixing every priced finding together buy? Findings overlap (a straggler's delay is
also its peers' exposed communication), so their lost times are never summed: the one engine
replays the causes removed together (bprof whatif with their scenarios joined by '+') and says so.

Reads the run's findings (written earlier in the same analysis) and what the what-if graph reads;
writes one info finding, nothing else.
"""

from __future__ import annotations

import json

import duckdb

from bprof.analyzers.base import Finding, Options, Result
from bprof.errors import DataError
from bprof.whatif import graph
from bprof.whatif.run import whatif

NAME = "joint"
TABLES: list[str] = []


def scenario_parts(rows: list[tuple[str, str, dict]]) -> list[str]:
    """The what-if parts that remove the causes of findings (analyzer, title, evidence), each once,
    in a fixed order: stragglers, host gaps by cause, batched small collectives, free transfers by
    dimension, balanced stages."""
    parts: list[str] = []
    for analyzer, title, evidence in rows:
        if analyzer == "stragglers":
            part = "no-stragglers"
        elif analyzer == "idle" and evidence.get("cause"):
            part = f"no-host-gaps:{evidence['cause']}"
        elif analyzer == "breakdown" and evidence.get("dim") and title.startswith("Exposed "):
            part = f"free-comm:{evidence['dim']}"
        elif analyzer == "phases" and title.startswith("Waiting for data"):
            part = "no-host-gaps:data_loading"
        elif analyzer == "bubbles" and title.startswith("Stage imbalance"):
            part = "balanced-stages"
        elif analyzer == "storms":
            part = "coalesce-small"
        else:
            continue
        if part not in parts:
            parts.append(part)
    order = ("no-stragglers", "no-host-gaps:", "coalesce-small", "free-comm:", "balanced-stages")
    return sorted(parts, key=lambda p: next(i for i, o in enumerate(order) if p.startswith(o)))


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    result = Result(NAME, TABLES)
    rows = con.execute("""SELECT analyzer, title, evidence, lost_ns FROM findings
                          WHERE run_id = ? AND lost_ns > 0 ORDER BY lost_ns DESC""", [run_id]).fetchall()
    priced = [(a, t, json.loads(e) if e else {}) for a, t, e, _ in rows]
    parts = scenario_parts(priced)
    if len(parts) < 2 or not graph.has_analysis(con, run_id):
        return result
    scenario = "+".join(parts)
    try:
        [summary] = whatif(con, run_id, [scenario], write=False).summaries[1:]
    except DataError:
        return result
    if summary["saved_ns"] is None:
        return result
    total_ns = sum(int(lost) for *_, lost in rows if lost)
    result.findings.append(Finding(
        "info",
        f"Fixed together, the priced findings would shorten the step by {summary['saved_ns'] / 1e6:.2f} ms "
        f"(each priced alone, they come to {total_ns / 1e6:.2f} ms: causes overlap and interact, never add them)",
        f"Rerun the joint prediction with `bprof whatif -s \"{scenario}\"`.",
        f"The one engine replayed every step with all of these causes removed at once ({scenario}): the job's "
        f"step goes from {summary['measured_step_ns'] / 1e6:.2f} ms to {summary['predicted_step_ns'] / 1e6:.2f} ms "
        f"(median over steps; saved {summary['saved_ns'] / 1e6:.2f} ms). Each finding's lost time is its cause "
        "removed alone; causes overlap (a straggler's delay is also its peers' exposed communication) and interact "
        "(with the straggler gone, transfers it hid behind its peers' wait reach the critical path).",
        None, {"scenario": scenario, "joint_saved_ns": summary["saved_ns"], "sum_of_lost_ns": total_ns,
               "predicted_step_ns": summary["predicted_step_ns"]}))
    return result
