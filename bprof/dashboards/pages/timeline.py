"""Timeline: one step across chosen ranks on aligned clocks, collectives linked across ranks."""

from __future__ import annotations

import duckdb

from bprof.dashboards.figures.timeline import MAX_RANKS, fig_timeline
from bprof.dashboards.sections import Chart, Download, Section, Text, View

PATH = "/timeline"
TITLE = "Timeline"
CONTROLS = ("run", "step", "ranks")
IN_HTML = False


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    if view.step is None:
        return [Text("no-steps", "no step was captured on every rank of this run", "warning")]
    out: list[Section] = [Chart("timeline", "Timeline", fig_timeline(con, view.run_id, view.step, list(view.ranks)))]
    if len(view.ranks) > MAX_RANKS:
        out.append(Text("timeline-ranks", f"the first {MAX_RANKS} chosen ranks are drawn", "warning"))
    ranks = ",".join(map(str, view.ranks))
    if not _have_events(con, view.run_id, list(view.ranks)):
        out.append(Text("timeline-export", "these ranks were ingested from `bprof reduce` outputs: their events "
                                           "stayed on the training hosts, so there is no Perfetto trace to make here"))
        return out
    out.append(Download("timeline-perfetto", f"Download step {view.step} of these ranks as a Perfetto trace (every event)",
                        "perfetto", {"run": view.run_id, "step": view.step, "ranks": list(view.ranks)}))
    out.append(Text("timeline-export", f"the same from the command line: bprof export {view.run_id} --perfetto FILE "
                                       f"--step {view.step} --ranks {ranks}  (opens in ui.perfetto.dev)"))
    return out


def _have_events(con: duckdb.DuckDBPyConnection, run_id: int, ranks: list[int]) -> bool:
    """False when any chosen rank came from a `bprof reduce` output (steps and collectives, no events)."""
    return con.execute("SELECT count(*) FROM reduced_ranks WHERE run_id = ? AND list_contains(?, rank)",
                       [run_id, ranks]).fetchone()[0] == 0
