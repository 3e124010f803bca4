"""What a report page is made of, independent of how it is shown.

A page returns a list of sections; the Dash app (app.py) and the static HTML export (html.py)
each render the same list, so both outputs show the same numbers. Every section has a `key`: the
element id both outputs give it (the browser tests find content by it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import plotly.graph_objects as go


@dataclass(frozen=True)
class Numbers:
    """Headline figures: (key, label, text) each."""
    key: str
    items: list[tuple[str, str, str]]


@dataclass(frozen=True)
class Table:
    """A small table of text cells (already formatted; shown as text, never as markup)."""
    key: str
    title: str
    columns: list[str]
    rows: list[list[str]]
    note: str | None = None


@dataclass(frozen=True)
class Chart:
    key: str
    title: str
    figure: go.Figure
    note: str | None = None


@dataclass(frozen=True)
class Text:
    key: str
    text: str
    kind: str = "note"   # note or warning


Section = Numbers | Table | Chart | Text


@dataclass(frozen=True)
class View:
    """What the reader chose: the run, and where a page needs them a step, ranks and a second run."""
    run_id: int | None
    step: int | None = None
    ranks: tuple[int, ...] = field(default_factory=tuple)
    base_run_id: int | None = None
