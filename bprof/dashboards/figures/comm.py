"""Communication figures: bus bandwidth against message size, arrival skew, exposed time by
parallel dimension. All from collperf_* and breakdown_dims, aggregated in SQL."""

from __future__ import annotations

import duckdb
import plotly.graph_objects as go

from bprof.dashboards.figures.style import empty, layout
from bprof.dashboards.read import frame, has_table

NOT_ANALYSED = "not analysed: run `bprof analyze` first"


def fig_busbw(con: duckdb.DuckDBPyConnection, run_id: int) -> go.Figure:
    """Median bus bandwidth of each (group, op, message-size bucket) against its median size; the
    link peak, where known, as a dashed line per op."""
    title = "Bus bandwidth vs message size (median per group, op and size bucket)"
    if not has_table(con, "collperf_groups"):
        return empty(title, NOT_ANALYSED)
    df = frame(con, """SELECT op, coalesce(pg_desc, pg_name) AS grp, median_bytes, median_busbw_bytes_per_s / 1e9 AS busbw_gbs,
                              num_instances, link_peak_bytes_per_s / 1e9 AS peak_gbs, spans_hosts
                       FROM collperf_groups WHERE run_id = ? AND median_busbw_bytes_per_s IS NOT NULL
                       ORDER BY op, median_bytes""", [run_id])
    if df.empty:
        return empty(title, "no collective with a measurable transfer time")
    fig = go.Figure()
    for op, part in df.groupby("op", sort=True):
        fig.add_scatter(x=part["median_bytes"], y=part["busbw_gbs"], mode="markers", name=op, marker=dict(size=9),
                        customdata=part[["grp", "num_instances"]].to_numpy(),
                        hovertemplate="%{customdata[0]}: %{x:.3s}B, %{y:.2f} GB/s (%{customdata[1]} calls)<extra>" + op + "</extra>")
    for peak in sorted(set(df["peak_gbs"].dropna())):
        fig.add_hline(y=peak, line_dash="dash", annotation_text=f"link peak {peak:.0f} GB/s")
    fig.update_xaxes(type="log", title="message size (bytes)")
    fig.update_yaxes(title="bus bandwidth (GB/s)")
    return layout(fig, title)


def fig_skew(con: duckdb.DuckDBPyConnection, run_id: int) -> go.Figure:
    """Distribution of arrival skew (last arrival - first, aligned clocks) per op: a histogram
    over log-spaced bins counted in SQL."""
    title = "Arrival skew of matched collectives (last arrival - first)"
    if not has_table(con, "collperf_instances"):
        return empty(title, NOT_ANALYSED)
    df = frame(con, """SELECT op, floor(log10(greatest(skew_ns, 1)) * 4) / 4 AS bin_log10_ns, count(*) AS n
                       FROM collperf_instances WHERE run_id = ? AND skew_ns IS NOT NULL AND NOT is_p2p
                       GROUP BY ALL ORDER BY op, bin_log10_ns""", [run_id])
    if df.empty:
        return empty(title, "no matched collective with aligned arrivals")
    # log-spaced bins as categories (bars on a log axis would be too thin to see), in order
    bins = sorted(set(df["bin_log10_ns"]))
    labels = {b: _duration(10 ** b) for b in bins}
    fig = go.Figure()
    for op, part in df.groupby("op", sort=True):
        fig.add_bar(x=[labels[b] for b in part["bin_log10_ns"]], y=part["n"], name=op,
                    hovertemplate="skew >= %{x}: %{y} calls<extra>" + op + "</extra>")
    fig.update_xaxes(title="arrival skew, at least (bins of 1/4 decade)", type="category",
                     categoryorder="array", categoryarray=[labels[b] for b in bins])
    fig.update_yaxes(title="instances")
    fig.update_layout(barmode="group")
    return layout(fig, title)


def _duration(ns: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if ns >= scale:
            return f"{ns / scale:.3g} {unit}"
    return f"{ns:.3g} ns"


def fig_dims(con: duckdb.DuckDBPyConnection, run_id: int) -> go.Figure:
    """Communication time per step by parallel dimension: in flight vs exposed (median rank)."""
    title = "Communication per step by parallel dimension (median over ranks and steps)"
    if not has_table(con, "breakdown_dims"):
        return empty(title, NOT_ANALYSED)
    df = frame(con, """SELECT dim, median(comm_ns) / 1e6 AS comm_ms, median(exposed_comm_ns) / 1e6 AS exposed_ms
                       FROM breakdown_dims WHERE run_id = ? GROUP BY dim ORDER BY comm_ms DESC""", [run_id])
    if df.empty:
        return empty(title, "no communication")
    fig = go.Figure()
    fig.add_bar(x=df["dim"], y=df["comm_ms"], name="in flight", marker_color="#F2CF5B")
    fig.add_bar(x=df["dim"], y=df["exposed_ms"], name="exposed", marker_color="#E45756")
    fig.update_layout(barmode="group", yaxis_title="ms per step")
    return layout(fig, title)
