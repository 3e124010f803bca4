"""Colours and layout shared by the figures, so one part of the step has one colour everywhere."""

from __future__ import annotations

import plotly.graph_objects as go

# The partition of a step's device span (DESIGN.md, "Definitions"), in stacking order.
PARTS = [("compute", "compute", "#4C78A8"), ("exposed_comm", "exposed comm", "#E45756"),
         ("overlapped_comm", "overlapped comm", "#F2CF5B"), ("memcpy", "memcpy", "#72B7B2"),
         ("idle", "idle", "#BAB0AC"), ("other", "other", "#B279A2")]


def layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(title=title, height=height, margin=dict(l=60, r=20, t=50, b=40),
                      template="plotly_white", legend=dict(orientation="h", y=-0.15))
    return fig


def empty(title: str, why: str) -> go.Figure:
    """A figure that says why it has nothing to show."""
    fig = go.Figure()
    fig.add_annotation(text=why, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return layout(fig, title, height=200)
