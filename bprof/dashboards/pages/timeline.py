"""Timeline: one step across chosen ranks on aligned clocks, collectives linked across ranks."""

from __future__ import annotations

import duckdb

from bprof.dashboards.figures.timeline import MAX_RANKS, fig_timeline
from bprof.dashboards.sections import Chart, Section, Text, View

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
    out.append(Text("timeline-export", f"every event of this step: bprof export {view.run_id} --perfetto FILE --step {view.step}"
                                       f" --ranks {','.join(map(str, view.ranks))}  (opens in ui.perfetto.dev)"))
    return out
