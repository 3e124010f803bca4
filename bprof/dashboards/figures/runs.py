"""History over runs: step time and MFU of every analysed run in the store, by start time (the
trend `bprof ci` gates on)."""

from __future__ import annotations

import duckdb
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from bprof.dashboards.figures.style import empty, layout
from bprof.dashboards.read import frame


def fig_history(con: duckdb.DuckDBPyConnection) -> go.Figure:
    """Step time and MFU per run, one line per benchmark (or run-name family when none)."""
    title = "Step time and MFU over runs"
    df = frame(con, """SELECT r.run_id, r.name, coalesce(r.benchmark, r.device_name, 'runs') AS series,
                              coalesce(r.started_at, r.ingested_at) AS started,
                              max(m.value) FILTER (WHERE m.name = 'step_time_ns') / 1e6 AS step_ms,
                              max(m.value) FILTER (WHERE m.name = 'mfu_frac') AS mfu
                       FROM runs r JOIN metrics m USING (run_id) GROUP BY ALL ORDER BY started, r.run_id""")
    if df.empty:
        return empty(title, "no analysed run yet")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08)
    for series, part in df.groupby("series", sort=False):
        hover = "run %{customdata[0]} %{customdata[1]}: %{y}<extra>" + str(series) + "</extra>"
        custom = part[["run_id", "name"]].to_numpy()
        fig.add_scatter(x=part["started"], y=part["step_ms"], mode="lines+markers", name=str(series), legendgroup=str(series),
                        customdata=custom, hovertemplate=hover, row=1, col=1)
        fig.add_scatter(x=part["started"], y=part["mfu"], mode="lines+markers", name=str(series), legendgroup=str(series),
                        showlegend=False, customdata=custom, hovertemplate=hover, row=2, col=1)
    fig.update_yaxes(title="step time (ms)", row=1, col=1)
    fig.update_yaxes(title="MFU", tickformat=".0%", row=2, col=1)
    return layout(fig, title, height=480)


def fig_ci_series(con: duckdb.DuckDBPyConnection) -> go.Figure:
    """The values `bprof ci` gates on (ci_metrics: per-run medians, outlier steps excluded), per
    baseline series in the order runs joined it, labelled by commit."""
    title = "CI baseline series (bprof ci record): the per-run values the gate compares"
    df = frame(con, """SELECT r.series, r.history_id, r.run_name, coalesce(left(r.git_sha, 8), r.run_name) AS label, m.metric,
                              CASE WHEN m.metric = 'step_time_ns' THEN m.value / 1e6 ELSE m.value END AS value
                       FROM ci_runs r JOIN ci_metrics m USING (history_id)
                       WHERE m.metric IN ('step_time_ns', 'mfu_frac') ORDER BY r.series, r.history_id""")
    if df.empty:
        return empty(title, "no CI history in this store (bprof ci record RUN --branch main adds runs)")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=False, vertical_spacing=0.12)
    for row, metric in ((1, "step_time_ns"), (2, "mfu_frac")):
        for series, part in df[df["metric"] == metric].groupby("series", sort=True):
            fig.add_scatter(x=part["history_id"], y=part["value"], mode="lines+markers", name=str(series),
                            legendgroup=str(series), showlegend=row == 1, customdata=part[["label", "run_name"]].to_numpy(),
                            hovertemplate="%{customdata[0]} (%{customdata[1]}): %{y}<extra>" + str(series) + "</extra>",
                            row=row, col=1)
    fig.update_yaxes(title="step time (ms)", row=1, col=1)
    fig.update_yaxes(title="MFU", tickformat=".1%", row=2, col=1)
    fig.update_xaxes(title="history id (order joined)", row=2, col=1)
    return layout(fig, title, height=480)
