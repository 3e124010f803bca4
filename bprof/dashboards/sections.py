"""What a report page is made of, independent of how it is shown.

A page returns a list of sections; the Dash app (app.py) and the static HTML export (export_html.py)
each render the same list, so both outputs show the same numbers. Every section has a `key`: the
element id both outputs give it (the browser tests find content by it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from urllib.parse import parse_qs, urlencode

import plotly.graph_objects as go


# What both renderers share: a table never shows more rows than this (the rest are counted under
# it), and one stylesheet.
MAX_TABLE_ROWS = 200


def css() -> str:
    return resources.files("bprof.dashboards").joinpath("report.css").read_text()


@dataclass(frozen=True)
class Numbers:
    """Headline figures: (key, label, text) each."""
    key: str
    items: list[tuple[str, str, str]]


@dataclass(frozen=True)
class Link:
    """A table cell that leads to another page of the report with the controls set (query: run,
    step, ranks). The static export has no such pages: its cell is empty."""
    text: str
    path: str
    query: dict[str, str]

    def href(self) -> str:
        return self.path + "?" + urlencode(self.query)


@dataclass(frozen=True)
class Details:
    """A table cell showing a short summary, with the full text on demand (HTML <details>): a
    finding's evidence as readable text, its raw JSON one click away."""
    summary: str
    full: str


@dataclass(frozen=True)
class Table:
    """A small table of text cells (already formatted; shown as text, never as markup) or links."""
    key: str
    title: str
    columns: list[str]
    rows: list[list[str | Link | Details]]
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


@dataclass(frozen=True)
class Download:
    """A file the served report makes on request: `kind` perfetto is `bprof export --perfetto` of
    `params` (run, step, ranks), sent as bprof-run<run>-step<step>.json.gz. The static export
    leaves it out (a file has no server)."""
    key: str
    label: str
    kind: str
    params: dict


Section = Numbers | Table | Chart | Text | Download


@dataclass(frozen=True)
class View:
    """What the reader chose: the run, and where a page needs them a step, ranks and a second run."""
    run_id: int | None
    step: int | None = None
    ranks: tuple[int, ...] = field(default_factory=tuple)
    base_run_id: int | None = None


def view_from_query(search: str | None) -> dict[str, object]:
    """The controls a report URL's query sets (?run=2&step=5&ranks=3,7): run and step as ints, ranks
    as a list of ints; what does not parse is left out."""
    q = parse_qs((search or "").lstrip("?"))
    out: dict[str, object] = {}
    for name in ("run", "step"):
        if q.get(name) and q[name][0].lstrip("-").isdigit():
            out[name] = int(q[name][0])
    if q.get("ranks"):
        ranks = [int(r) for r in q["ranks"][0].split(",") if r.strip().isdigit()]
        if ranks:
            out["ranks"] = ranks
    return out
