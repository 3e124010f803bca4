"""What a page shows before the reader chooses: a step in the middle of the common steps, and the
ranks worth looking at first (flagged stragglers, then the slowest ranks)."""

from __future__ import annotations

import duckdb

from bprof.dashboards.read import has_table, steps
from bprof.dashboards.sections import View

DEFAULT_RANKS = 4


def with_defaults(con: duckdb.DuckDBPyConnection, view: View) -> View:
    if view.run_id is None:
        return view
    step = view.step
    common = steps(con, view.run_id)
    if step is None or step not in common:
        step = common[len(common) // 2] if common else None
    chosen = tuple(view.ranks) or tuple(interesting_ranks(con, view.run_id))
    return View(view.run_id, step, chosen, view.base_run_id)


def interesting_ranks(con: duckdb.DuckDBPyConnection, run_id: int, n: int = DEFAULT_RANKS) -> list[int]:
    """Flagged stragglers by lost time, then ranks by median step time (slowest first); rank order
    when the run is not analysed."""
    picked: list[int] = []
    if has_table(con, "stragglers_ranks"):
        picked += [r for (r,) in con.execute("""SELECT rank FROM stragglers_ranks WHERE run_id = ? AND flagged
                                                ORDER BY lost_ns DESC LIMIT ?""", [run_id, n]).fetchall()]
    if has_table(con, "breakdown_ranks"):
        picked += [r for (r,) in con.execute("""SELECT rank FROM breakdown_ranks WHERE run_id = ?
                                                ORDER BY median_step_ns DESC, rank LIMIT ?""", [run_id, 2 * n]).fetchall()]
    picked += [r for (r,) in con.execute("SELECT rank FROM ranks WHERE run_id = ? ORDER BY rank LIMIT ?", [run_id, n]).fetchall()]
    return sorted(list(dict.fromkeys(picked))[:n])
