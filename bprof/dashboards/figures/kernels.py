"""Kernel figures: time by class, and the roofline of ops with recorded shapes."""

from __future__ import annotations

import duckdb
import numpy as np
import plotly.graph_objects as go

from bprof.dashboards.figures.style import empty, layout
from bprof.dashboards.read import frame, has_table

# The roofline shows the ops that take the most time; the rest are summed in its title.
MAX_ROOFLINE_POINTS = 200


def fig_classes(con: duckdb.DuckDBPyConnection, run_id: int) -> go.Figure:
    """Kernel (device op) time per step by class, summed over ranks, as a share."""
    title = "Kernel time by class (all ranks)"
    if not has_table(con, "kernels_classes"):
        return empty(title, "not analysed: run `bprof analyze` first")
    df = frame(con, """SELECT fine_class, sum(dur_ns) / 1e6 AS ms, sum(dur_ns) / sum(sum(dur_ns)) OVER () AS share
                       FROM kernels_classes WHERE run_id = ? GROUP BY fine_class ORDER BY ms""", [run_id])
    if df.empty:
        return empty(title, "no kernels")
    fig = go.Figure(go.Bar(x=df["ms"], y=df["fine_class"], orientation="h", customdata=df["share"],
                           hovertemplate="%{y}: %{x:.1f} ms (%{customdata:.1%})<extra></extra>"))
    fig.update_xaxes(title="ms (sum over ranks and captured steps)")
    return layout(fig, title, height=max(300, 24 * len(df) + 100))


def fig_roofline(con: duckdb.DuckDBPyConnection, run_id: int) -> go.Figure:
    """Achieved FLOP/s against arithmetic intensity for the ops with recorded shapes (the
    MAX_ROOFLINE_POINTS that take the most time), under the device's compute and memory roofs."""
    title = "Roofline: achieved vs peak (ops with recorded shapes)"
    if not has_table(con, "kernels_roofline"):
        return empty(title, "not analysed: run `bprof analyze` first")
    df = frame(con, """SELECT name, input_dims, dtype, num_calls, dur_ns / 1e6 AS ms, achieved_flops_per_s / 1e12 AS tflops,
                              intensity_flops_per_byte AS intensity, peak_flops_per_s / 1e12 AS peak_tflops,
                              peak_bytes_per_s / 1e9 AS peak_gbs, bound, peak_frac
                       FROM kernels_roofline WHERE run_id = ? AND achieved_flops_per_s > 0 AND intensity_flops_per_byte > 0
                       ORDER BY dur_ns DESC LIMIT ?""", [run_id, MAX_ROOFLINE_POINTS])
    if df.empty:
        return empty(title, "no op with recorded shapes and FLOPs")
    fig = go.Figure(go.Scatter(
        x=df["intensity"], y=df["tflops"], mode="markers", name="ops",
        marker=dict(size=np.clip(np.sqrt(df["ms"] / df["ms"].max()) * 24, 5, 24), color=df["peak_frac"],
                    colorscale="Viridis", cmin=0, cmax=1, colorbar_title="of peak", showscale=True),
        customdata=df[["name", "input_dims", "dtype", "ms", "bound"]].astype(str).to_numpy(),
        hovertemplate="%{customdata[0]} %{customdata[1]} %{customdata[2]}<br>%{y:.3f} TFLOP/s at %{x:.1f} FLOP/B, "
                      "%{customdata[3]} ms, %{customdata[4]}-bound<extra></extra>"))
    peaks = df.dropna(subset=["peak_tflops"])
    if not peaks.empty:
        peak_tflops = float(peaks["peak_tflops"].max())
        x = np.logspace(np.log10(df["intensity"].min() / 2), np.log10(df["intensity"].max() * 2), 64)
        roof = np.full_like(x, peak_tflops)
        if peaks["peak_gbs"].notna().any():
            roof = np.minimum(roof, x * float(peaks["peak_gbs"].max()) / 1e3)
        fig.add_scatter(x=x, y=roof, mode="lines", name="roof", line=dict(dash="dash", color="black"))
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOP/byte)")
    fig.update_yaxes(type="log", title="achieved TFLOP/s")
    return layout(fig, title, height=450)
