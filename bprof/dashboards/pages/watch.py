"""Between windows: a watched run's series as rank x iteration heatmaps, when it went wrong, and
the windows the watch opened with their reasons."""

from __future__ import annotations

import duckdb

from bprof.dashboards import format as fmt
from bprof.dashboards.figures.watch import SERIES, fig_watch_heatmap, recording_of
from bprof.dashboards.read import rows
from bprof.dashboards.sections import Chart, Link, Section, Table, Text, View

PATH = "/watch"
TITLE = "Between windows"
CONTROLS = ("run",)


def IN_HTML(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:  # noqa: N802 - the pages' shared attribute
    """The static export has this page for a window run of a watched recording only."""
    return recording_of(con, run_id) is not None


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    recording = recording_of(con, view.run_id)
    if recording is None:
        return [Text("no-watch", "this run has no watch series (record it with bprof record --watch)")]
    out: list[Section] = [Chart(f"watch-heatmap-{metric}", label, fig_watch_heatmap(con, view.run_id, metric))
                          for metric, (_, label) in SERIES.items()]
    episodes = rows(con, """SELECT rule, rank, first_iteration, last_iteration, worst_score, triggered FROM watch_episodes
                            WHERE recording_id = ? ORDER BY episode_index""", [recording])
    out.append(Table("watch-episodes", "When it went wrong", ["rule", "rank", "iterations", "worst score", "window"],
                     [[e["rule"], "" if e["rank"] is None else str(e["rank"]),
                       f"{e['first_iteration']}-{e['last_iteration']}", f"{e['worst_score']:.2f}x",
                       "opened" if e["triggered"] else "none"] for e in episodes],
                     note=None if episodes else "no rule of the live analysis held"))
    triggers = rows(con, """SELECT t.start_iteration, t.start_iteration + t.num_steps AS end_iteration,
                                   t.seen_at_iteration, t.rule, t.reason, t.run_id, r.name AS run_name
                            FROM watch_triggers t LEFT JOIN runs r USING (run_id)
                            WHERE t.recording_id = ? ORDER BY t.trigger_index""", [recording])
    out.append(Table("watch-triggers", "Windows the watch opened", ["window", "seen at", "rule", "reason", "run", "see"],
                     [[f"{t['start_iteration']}:{t['end_iteration']}", str(t["seen_at_iteration"]), t["rule"],
                       fmt.text(t["reason"]),
                       f"{t['run_id']} {t['run_name']}" if t["run_id"] is not None else "not captured",
                       Link("overview", "/overview", {"run": str(t["run_id"])}) if t["run_id"] is not None else ""]
                      for t in triggers],
                     note=None if triggers else "the watch opened no window"))
    return out
