"""What-if figures: the steps `bprof whatif` predicted, per rank, against the measured ones."""

from __future__ import annotations

import duckdb
import plotly.graph_objects as go

from bprof.dashboards.figures.style import empty, layout
from bprof.dashboards.read import frame


def fig_whatif_ranks(con: duckdb.DuckDBPyConnection, run_id: int) -> go.Figure:
    """Median step time per rank, measured and predicted by each stored scenario."""
    title = "Step time per rank: measured and predicted (median over steps)"
    df = frame(con, """SELECT scenario, rank, median(measured_ns) / 1e6 AS measured_ms, median(predicted_ns) / 1e6 AS predicted_ms
                       FROM whatif WHERE run_id = ? GROUP BY ALL ORDER BY scenario, rank""", [run_id])
    if df.empty:
        return empty(title, "no per-rank predictions")
    fig = go.Figure()
    measured = df.groupby("rank", sort=True)["measured_ms"].first()
    fig.add_scatter(x=measured.index, y=measured.values, mode="lines+markers", name="measured", line=dict(color="black"))
    for scenario, part in df.groupby("scenario", sort=True):
        fig.add_scatter(x=part["rank"], y=part["predicted_ms"], mode="lines+markers", name=str(scenario))
    fig.update_xaxes(title="rank")
    fig.update_yaxes(title="ms per step")
    return layout(fig, title)
