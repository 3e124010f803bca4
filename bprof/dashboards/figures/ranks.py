"""Per-rank figures: where each rank's step goes, and rank x step heatmaps (grouped by host)."""

from __future__ import annotations

import duckdb
import plotly.graph_objects as go

from bprof.dashboards.figures.style import PARTS, empty, layout
from bprof.dashboards.read import frame, has_table

# Up to this many ranks the split is one stacked bar per rank; above it, a rank x part heatmap.
MAX_BAR_RANKS = 64

# Heatmap metrics of breakdown_steps: (column, label).
HEATMAPS = {"span_ns": "step time", "exposed_comm_ns": "exposed communication", "idle_ns": "idle",
            "exposed_wait_ns": "straggler wait (waiting for the last peer)"}


def fig_split(con: duckdb.DuckDBPyConnection, run_id: int) -> go.Figure:
    """Median time per step of each part of the partition, per rank (ms)."""
    title = "Where the step goes, per rank (median over steps)"
    if not has_table(con, "breakdown_steps"):
        return empty(title, "not analysed: run `bprof analyze` first")
    parts = ", ".join(f"median({p}_ns) / 1e6 AS {p}" for p, _, _ in PARTS)
    df = frame(con, f"""SELECT s.rank, r.host, {parts} FROM breakdown_steps s JOIN ranks r USING (run_id, rank)
                        WHERE run_id = ? GROUP BY s.rank, r.host ORDER BY r.host, s.rank""", [run_id])
    if df.empty:
        return empty(title, "no analysed steps")
    labels = [f"rank {r}" for r in df["rank"]]
    fig = go.Figure()
    if len(df) <= MAX_BAR_RANKS:
        for col, label, colour in PARTS:
            fig.add_bar(name=label, x=labels, y=df[col], marker_color=colour, customdata=df["host"],
                        hovertemplate="%{x} (%{customdata}): %{y:.2f} ms<extra>" + label + "</extra>")
        fig.update_layout(barmode="stack", yaxis_title="ms per step")
        return layout(fig, title)
    share = df[[p for p, _, _ in PARTS]].div(df[[p for p, _, _ in PARTS]].sum(axis=1), axis=0)
    fig.add_heatmap(z=share.to_numpy(), x=[label for _, label, _ in PARTS], y=labels, colorscale="Viridis",
                    zmin=0, zmax=1, colorbar_title="share", customdata=df[["host"]].to_numpy().repeat(len(PARTS), axis=1),
                    hovertemplate="%{y} (%{customdata}) %{x}: %{z:.1%}<extra></extra>")
    fig.update_yaxes(autorange="reversed", showticklabels=len(df) <= 256)
    return layout(fig, title + f": share of the step, {len(df):,} ranks", height=600)


def fig_rank_heatmap(con: duckdb.DuckDBPyConnection, run_id: int, column: str) -> go.Figure:
    """Rank x step heatmap of one breakdown_steps column (ms); rows grouped by host, host
    boundaries drawn when there are few enough hosts to see them."""
    label = HEATMAPS[column]   # the column name comes from this fixed table, never from the reader
    title = f"{label.capitalize()} per rank and step (ms)"
    if not has_table(con, "breakdown_steps"):
        return empty(title, "not analysed: run `bprof analyze` first")
    df = frame(con, f"""SELECT s.rank, coalesce(r.host, '?') AS host, s.step, s.{column} / 1e6 AS value_ms
                        FROM breakdown_steps s JOIN ranks r USING (run_id, rank)
                        WHERE run_id = ? ORDER BY host, s.rank, s.step""", [run_id])
    if df.empty:
        return empty(title, "no analysed steps")
    grid = df.pivot_table(index=["host", "rank"], columns="step", values="value_ms", sort=False)
    hosts = [h for h, _ in grid.index]
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=[str(s) for s in grid.columns], y=[f"rank {r}" for _, r in grid.index],
        customdata=[[h] * len(grid.columns) for h in hosts], colorscale="Inferno", colorbar_title="ms",
        hovertemplate="%{y} on %{customdata}, step %{x}: %{z:.2f} ms<extra></extra>"))
    fig.update_xaxes(title="step", type="category")
    fig.update_yaxes(autorange="reversed", showticklabels=len(grid) <= 64)
    boundaries = [i for i in range(1, len(hosts)) if hosts[i] != hosts[i - 1]]
    if len(boundaries) <= 64:
        for i in boundaries:
            fig.add_hline(y=i - 0.5, line_color="white", line_width=1)
    return layout(fig, title, height=min(900, 200 + 14 * len(grid)))
