"""Who was slow before the hang: the straggler analysis of a step window captured before it,
joined with who is stuck now.

Reads stragglers_ranks (bprof.analyzers.stragglers) and steps of the run the hang attaches to. A
rank counts as late in the window when the straggler analysis flagged it (its lost_ns crossed the
threshold) or found it measurably slower than its peers: the ranks that have a straggler finding.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from bprof.hang.verdict import Verdict


@dataclass
class LateRank:
    rank: int
    lost_ns: int | None  # stragglers_ranks.lost_ns: what the job's step would get back without it
    last_frac: float | None  # share of its collectives it arrived at last
    cause: str | None  # device or host


@dataclass
class Before:
    run_id: int
    run_name: str
    steps: list[int]
    analysed: bool  # the run has stragglers_ranks rows (False: no answer, not "nobody was late")
    late: list[LateRank]
    not_measurable: str | None = None  # the straggler analysis's own "not measurable" finding

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "run_name": self.run_name, "steps": self.steps, "analysed": self.analysed,
                "late_ranks": [r.rank for r in self.late], "late": [r.__dict__ for r in self.late],
                "not_measurable": self.not_measurable}


def read_before(con: duckdb.DuckDBPyConnection, run_id: int) -> Before | None:
    """The run's captured window and its late ranks; None when the run has no steps (a run row of
    the hang alone, or a window without a step)."""
    name, steps = con.execute("""
        SELECT r.name, (SELECT list(DISTINCT s.step ORDER BY s.step) FROM steps s WHERE s.run_id = r.run_id)
        FROM runs r WHERE r.run_id = ?""", [run_id]).fetchone()
    if not steps:
        return None
    has_table = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'stragglers_ranks'").fetchone()[0]
    analysed = bool(has_table) and con.execute(
        "SELECT count(*) FROM stragglers_ranks WHERE run_id = ?", [run_id]).fetchone()[0] > 0
    late = []
    if analysed:
        late = [LateRank(*row) for row in con.execute("""
            SELECT rank, lost_ns, last_frac, cause FROM stragglers_ranks
            WHERE run_id = ? AND (flagged OR coalesce(measurably_slower, false))
            ORDER BY lost_ns DESC NULLS LAST, rank""", [run_id]).fetchall()]
    why = con.execute("""
        SELECT first(title ORDER BY finding_id) FROM findings
        WHERE run_id = ? AND analyzer = 'stragglers' AND severity = 'not_measurable'""", [run_id]).fetchone()[0]
    return Before(run_id, name, list(steps), analysed, late, why)


def join(verdict: Verdict, before: Before) -> None:
    """Say in the verdict which ranks were already late in the window, and whether each culprit was."""
    late = {r.rank for r in before.late}
    for c in verdict.culprits:
        c.late_before = c.rank in late if before.analysed else None
    verdict.before = before.to_json()
    window = f"the window captured before (run {before.run_id} \"{before.run_name}\", steps {_steps(before.steps)})"
    stuck = {c.rank for c in verdict.culprits}
    if not before.analysed:
        said = f"{window} has no straggler analysis" + (f" ({before.not_measurable})" if before.not_measurable else "")
    elif not late:
        said = f"no rank was late in {window}" + (f" ({before.not_measurable})" if before.not_measurable else "")
    else:
        said = f"already late in {window}: " + ", ".join(
            f"rank {r.rank} ({'stuck now' if r.rank in stuck else 'not a culprit now'}"
            + (f", {r.lost_ns / 1e6:.2f} ms/step" if r.lost_ns else "") + ")" for r in before.late)
    verdict.verdict = f"{verdict.verdict}; {said}"


def _steps(steps: list[int]) -> str:
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"
