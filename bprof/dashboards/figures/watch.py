"""Between windows: rank x iteration heatmaps of a watched recording's series (bprof record --watch),
with the trace windows marked, triggered ones labelled with their rule."""

from __future__ import annotations

import math

import duckdb
import plotly.graph_objects as go

from bprof.dashboards.figures.style import empty, layout
from bprof.dashboards.read import frame, rows

# metric -> (SQL expression over watch_steps, label); the expression comes from this table only
SERIES = {"own": ("busy_ns + data_idle_ns", "own time (busy + waiting for data)"),
          "step": ("step_ns", "step time")}
# Above this many cells iterations are binned (each cell the slowest of its iterations): a rank x
# time heatmap at scale, still one row per rank.
MAX_CELLS = 250_000


def recording_of(con: duckdb.DuckDBPyConnection, run_id: int | None) -> int | None:
    """The watched recording of a window run, or None."""
    if run_id is None:
        return None
    return con.execute("SELECT min(recording_id) FROM watch_windows WHERE run_id = ?", [run_id]).fetchone()[0]


def fig_watch_heatmap(con: duckdb.DuckDBPyConnection, run_id: int | None, metric: str,
                      recording_id: int | None = None) -> go.Figure:
    """Rank x iteration heatmap (ms) of one series of the run's recording (or `recording_id`)."""
    expr, label = SERIES[metric]
    title = f"{label.capitalize()} per rank and iteration between windows (ms)"
    recording_id = recording_id if recording_id is not None else recording_of(con, run_id)
    if recording_id is None:
        return empty(title, "no watch series: record with bprof record --watch")
    num_ranks, first, last = con.execute("""SELECT count(DISTINCT rank), min(iteration), max(iteration)
                                            FROM watch_steps WHERE recording_id = ?""", [recording_id]).fetchone()
    if not num_ranks:
        return empty(title, "no watch rows")
    span = last - first + 1
    width = max(1, math.ceil(num_ranks * span / MAX_CELLS))  # iterations per cell
    df = frame(con, f"""
        SELECT rank, coalesce(any_value(host), '?') AS host, $first + (iteration - $first) // $width * $width AS bin,
               max({expr}) / 1e6 AS value_ms, bool_or(windowed) AS windowed
        FROM watch_steps WHERE recording_id = $id GROUP BY rank, bin ORDER BY host, rank, bin""",
               {"id": recording_id, "first": first, "width": width})
    grid = df.pivot_table(index=["host", "rank"], columns="bin", values="value_ms", sort=False)
    hosts = [h for h, _ in grid.index]
    unit = "iteration" if width == 1 else f"{width} iterations (slowest)"
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=[int(b) for b in grid.columns], y=[f"rank {r}" for _, r in grid.index],
        customdata=[[h] * len(grid.columns) for h in hosts], colorscale="Inferno", colorbar_title="ms",
        hovertemplate="%{y} on %{customdata}, iteration %{x}: %{z:.2f} ms<extra></extra>"))
    for w in rows(con, """SELECT w.start_iteration, w.end_iteration, w.window_range, t.rule, t.rank
                          FROM watch_windows w LEFT JOIN watch_triggers t
                            ON t.recording_id = w.recording_id AND t.run_id = w.run_id
                          WHERE w.recording_id = ? ORDER BY w.start_iteration""", [recording_id]):
        why = f"triggered: {w['rule']} rule" + (f", rank {w['rank']}" if w["rank"] is not None else "") if w["rule"] else "chosen"
        fig.add_vrect(x0=w["start_iteration"] - 0.5, x1=w["end_iteration"] - 0.5, line_color="#39c", line_width=2,
                      fillcolor="rgba(0,0,0,0)", annotation_text=f"window {w['window_range']} ({why})",
                      annotation_position="top left")
    for t in rows(con, """SELECT start_iteration, start_iteration + num_steps AS end_iteration, rule FROM watch_triggers
                          WHERE recording_id = ? AND run_id IS NULL""", [recording_id]):
        fig.add_vrect(x0=t["start_iteration"] - 0.5, x1=t["end_iteration"] - 0.5, line_color="#39c", line_dash="dot",
                      fillcolor="rgba(0,0,0,0)", annotation_text=f"asked {t['start_iteration']}:{t['end_iteration']}"
                      " (not captured)", annotation_position="top left")
    fig.update_xaxes(title=unit)
    fig.update_yaxes(autorange="reversed", showticklabels=len(grid) <= 64)
    boundaries = [i for i in range(1, len(hosts)) if hosts[i] != hosts[i - 1]]
    if len(boundaries) <= 64:
        for i in boundaries:
            fig.add_hline(y=i - 0.5, line_color="white", line_width=1)
    return layout(fig, title, height=min(900, 220 + 14 * len(grid)))
