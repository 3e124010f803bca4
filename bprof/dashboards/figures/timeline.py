"""One step across chosen ranks on aligned clocks, with matched collectives linked across ranks."""

from __future__ import annotations

import duckdb
import plotly.graph_objects as go

from bprof.dashboards.figures.style import empty, layout
from bprof.dashboards.read import frame, has_table

# A browser draws a few thousand bars per figure without lag: per rank, the longest events of the
# step are kept, and events shorter than 1/2000 of the step (under a pixel) are left out.
MAX_EVENTS_PER_RANK = 1500
MIN_DUR_FRAC = 1 / 2000
MAX_RANKS = 16

DRAW_ORDER = {"user_annotation": 0, "cpu_op": 1, "gpu_memcpy": 2, "gpu_memset": 2, "kernel": 3}
KIND_COLOURS = {"kernel": "#4C78A8", "gpu_memcpy": "#72B7B2", "gpu_memset": "#72B7B2", "cpu_op": "#9ECAE9",
                "user_annotation": "#B279A2", "collective": "#E45756"}

# Algorithm: the step window of each chosen rank, shifted by its host's clock offset; the events
# inside it on the training threads (timeline_threads) and device streams, longest first, at most
# MAX_EVENTS_PER_RANK per rank and none shorter than MIN_DUR_FRAC of the step.
_EVENTS = """
WITH win AS (
    SELECT s.rank, s.ts_ns, s.ts_ns + s.dur_ns AS end_ns, coalesce(r.clock_offset_ns, 0) AS offset_ns, s.dur_ns
    FROM steps s JOIN ranks r USING (run_id, rank)
    WHERE s.run_id = $run_id AND s.step = $step AND list_contains($ranks, s.rank)
), threads AS (
    SELECT rank, tid, min(role) AS role FROM timeline_threads WHERE run_id = $run_id GROUP BY ALL
), picked AS (
    SELECT e.rank, e.kind, e.name,
           CASE WHEN e.stream IS NOT NULL THEN 'stream ' || e.stream ELSE 'host ' || t.role END AS lane,
           e.ts_ns + w.offset_ns AS start_aligned_ns, e.dur_ns,
           row_number() OVER (PARTITION BY e.rank ORDER BY e.dur_ns DESC) AS nth
    FROM events e
    JOIN win w ON w.rank = e.rank
    LEFT JOIN threads t ON t.rank = e.rank AND t.tid = e.tid
    WHERE e.run_id = $run_id AND e.kind IN ('kernel', 'gpu_memcpy', 'gpu_memset', 'cpu_op', 'user_annotation')
      AND (e.stream IS NOT NULL OR t.role IS NOT NULL)
      AND e.ts_ns < w.end_ns AND e.ts_ns + e.dur_ns > w.ts_ns AND e.dur_ns >= w.dur_ns * $min_frac
)
SELECT rank, kind, name, lane, start_aligned_ns, dur_ns FROM picked WHERE nth <= $max_events
ORDER BY dur_ns DESC  -- longest first: nested ranges are drawn under what they contain
"""

# aligned = own + the rank's offset (what the view match_members_aligned gives), spelt out so that a
# store analysed before that view existed still draws
_MEMBERS = """
SELECT m.instance_id, m.rank, i.op, coalesce(i.pg_desc, i.pg_name) AS grp, i.seq,
       m.arrival_ts_ns + r.clock_offset_ns AS arrival_aligned_ns, m.end_ts_ns + r.clock_offset_ns AS end_aligned_ns
FROM match_members m JOIN match_instances i USING (run_id, instance_id)
JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank
WHERE m.run_id = $run_id AND m.step = $step AND list_contains($ranks, m.rank) AND r.clock_offset_ns IS NOT NULL
ORDER BY m.instance_id, m.rank
"""


def fig_timeline(con: duckdb.DuckDBPyConnection, run_id: int, step: int, ranks: list[int]) -> go.Figure:
    """Lanes per rank (device streams, training threads, collectives) for one step, in ms from the
    earliest aligned step start; a grey line joins the arrivals of each matched collective."""
    ranks = sorted(ranks)[:MAX_RANKS]
    title = f"Step {step} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} (aligned clocks)"
    if not has_table(con, "timeline_threads") or not has_table(con, "match_members"):
        return empty(title, "not analysed: run `bprof analyze` first")
    params = {"run_id": run_id, "step": step, "ranks": ranks}
    ev = frame(con, _EVENTS, {**params, "min_frac": MIN_DUR_FRAC, "max_events": MAX_EVENTS_PER_RANK})
    mem = frame(con, _MEMBERS, params)
    if ev.empty and mem.empty:
        return empty(title, "no events of this step on these ranks")
    origin = min([v for v in (ev["start_aligned_ns"].min() if not ev.empty else None,
                              mem["arrival_aligned_ns"].min() if not mem.empty else None) if v is not None])
    fig = go.Figure()
    lanes: list[str] = []
    if not ev.empty:
        ev["lane_label"] = "r" + ev["rank"].astype(str) + " " + ev["lane"]
        lanes += sorted(set(ev["lane_label"]), key=lambda s: (int(s.split()[0][1:]), s))
        # ranges (the step annotation) behind the ops they contain, ops behind nothing
        for kind, part in sorted(ev.groupby("kind", sort=False), key=lambda kp: DRAW_ORDER.get(kp[0], 9)):
            fig.add_bar(base=(part["start_aligned_ns"] - origin) / 1e6, x=part["dur_ns"] / 1e6, y=part["lane_label"],
                        orientation="h", name=kind, marker_color=KIND_COLOURS.get(kind, "#888"), customdata=part["name"],
                        hovertemplate="%{customdata}<br>%{base:.3f} ms + %{x:.3f} ms<extra>" + kind + "</extra>")
    if not mem.empty:
        mem["lane_label"] = "r" + mem["rank"].astype(str) + " collectives"
        lanes += sorted(set(mem["lane_label"]), key=lambda s: int(s.split()[0][1:]))
        fig.add_bar(base=(mem["arrival_aligned_ns"] - origin) / 1e6,
                    x=(mem["end_aligned_ns"] - mem["arrival_aligned_ns"]) / 1e6, y=mem["lane_label"], orientation="h",
                    name="collective", marker_color=KIND_COLOURS["collective"],
                    customdata=mem[["op", "grp", "seq"]].astype(str).to_numpy(),
                    hovertemplate="%{customdata[0]} %{customdata[1]} #%{customdata[2]}<br>arrived %{base:.3f} ms, "
                                  "%{x:.3f} ms to the common end<extra></extra>")
        xs, ys = [], []
        for _, inst in mem.groupby("instance_id", sort=False):
            if len(inst) > 1:
                xs += list((inst["arrival_aligned_ns"] - origin) / 1e6) + [None]
                ys += list(inst["lane_label"]) + [None]
        if xs:
            fig.add_scatter(x=xs, y=ys, mode="lines", name="same collective", line=dict(color="#555", width=1),
                            hoverinfo="skip")
    order = sorted(dict.fromkeys(lanes), key=lambda s: (int(s.split()[0][1:]), s))
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], type="category")
    fig.update_xaxes(title="ms from the earliest aligned step start")
    fig.update_layout(barmode="overlay")
    return layout(fig, title, height=max(320, 26 * len(order) + 140))
