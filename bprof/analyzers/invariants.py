"""Physical invariants of findings, enforced before they are written: a finding's lost_ns (what
removing its cause buys per step) is never above the step time of the rank(s) it names, nor below
zero. A finding that breaks one keeps its title and evidence but becomes `not_measurable`, its
number withheld and the reason stated: a number that cannot be true is never printed.

Reads timeline_spans (the step spans every analysis partitions); writes nothing itself.
"""

from __future__ import annotations

import dataclasses

import duckdb

from bprof.analyzers.base import Finding, table_exists


def step_ns_by_rank(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, int]:
    """Each rank's median step span (timeline_spans; the whole trace, step -1, for a rank without steps)."""
    if not table_exists(con, "timeline_spans"):
        return {}
    return {int(r): int(ns) for r, ns in con.execute(
        """SELECT rank, median(dur_ns) FROM timeline_spans WHERE run_id = ? GROUP BY rank""",
        [run_id]).fetchall()}


def bounded(findings: list[Finding], step_ns: dict[int, int]) -> list[Finding]:
    """`findings` with each one whose lost_ns breaks an invariant made not_measurable. The bound is
    the longest median step among the ranks the evidence names (`ranks` or `rank`), or among all
    ranks when it names none; without spans nothing can be checked and findings pass unchanged."""
    if not step_ns:
        return list(findings)
    job_ns = max(step_ns.values())
    out = []
    for f in findings:
        if f.lost_ns is None or f.severity == "not_measurable":
            out.append(f)
            continue
        named = _ranks(f.evidence)
        known = [step_ns[r] for r in named if r in step_ns]
        bound = max(known) if known else job_ns
        why = None
        if f.lost_ns < 0:
            why = f"the computed lost time ({f.lost_ns / 1e6:.2f} ms per step) is negative"
        elif f.lost_ns > bound:
            who = f"rank {named[0]}" if len(named) == 1 else f"ranks {named}" if named else "the job"
            why = (f"the computed lost time ({f.lost_ns / 1e6:.2f} ms per step) exceeds the step of {who} "
                   f"({bound / 1e6:.2f} ms): the model behind it does not describe this run")
        if why is None:
            out.append(f)
            continue
        out.append(dataclasses.replace(
            f, severity="not_measurable", lost_ns=None,
            detail=f"{why}; the number is withheld." + (f"\n{f.detail}" if f.detail else ""),
            evidence={**f.evidence, "withheld_lost_ns": int(f.lost_ns), "invariant": "lost_ns <= step of the named ranks"}))
    return out


def _ranks(evidence: dict) -> list[int]:
    ranks = evidence.get("ranks")
    if isinstance(ranks, list):
        return [int(r) for r in ranks if isinstance(r, int)]
    rank = evidence.get("rank")
    return [int(rank)] if isinstance(rank, int) else []
