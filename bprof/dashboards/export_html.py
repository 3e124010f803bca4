"""`bprof report RUN --html FILE`: one self-contained HTML file (plotly.js inlined, no network) with
the pages marked IN_HTML (overview, ranks, communication, kernels, what-if; between windows for a
window run of a watched recording), from the same sections as the
Dash app. Every trace-derived text is HTML-escaped."""

from __future__ import annotations

import html
from pathlib import Path

import duckdb
import plotly.io as pio
from plotly.offline import get_plotlyjs

from bprof.dashboards.pages import PAGES, in_html
from bprof.dashboards.pages.defaults import with_defaults
from bprof.dashboards.read import run_info
from bprof.dashboards.sections import MAX_TABLE_ROWS, Chart, Details, Download, Link, Numbers, Section, Table, Text, View, css


def export_html(con: duckdb.DuckDBPyConnection, run_id: int, path: Path) -> dict:
    """Write the report of one run to `path`; returns what was written (pages, charts, bytes)."""
    view = with_defaults(con, View(run_id))
    run = run_info(con, run_id)
    pages = [p for p in PAGES if in_html(p, con, run_id)]
    body, charts = [], 0
    for page in pages:
        sections = page.sections(con, view)
        charts += sum(isinstance(s, Chart) for s in sections)
        anchor = page.__name__.rsplit(".", 1)[-1]
        body.append(f'<section id="page-{anchor}"><h2>{_e(page.TITLE)}</h2>{"".join(map(_section, sections))}</section>')
    nav = "".join(f'<a href="#page-{p.__name__.rsplit(".", 1)[-1]}">{_e(p.TITLE)}</a>' for p in pages)
    title = f"bprof report: run {run['run_id']} {run['name']}"
    document = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
                f'<style>{css()}</style><script type="text/javascript">{get_plotlyjs()}</script></head>'
                f'<body><header><span class="brand">bprof</span><span>{_e(title)}</span>{nav}</header>'
                f'<main>{"".join(body)}</main></body></html>')
    path = Path(path)
    path.write_text(document, encoding="utf-8")
    return {"path": str(path), "pages": [p.TITLE for p in pages], "charts": charts, "bytes": path.stat().st_size}


def _section(s: Section) -> str:
    if isinstance(s, Numbers):
        items = "".join(f'<div class="item"><span class="label">{_e(label)}</span>'
                        f'<span class="value" id="{_e(s.key)}-{_e(key)}">{_e(text)}</span></div>'
                        for key, label, text in s.items)
        return f'<div class="numbers" id="{_e(s.key)}">{items}</div>'
    if isinstance(s, Table):
        shown = s.rows[:MAX_TABLE_ROWS]
        head = "".join(f"<th>{_e(c)}</th>" for c in s.columns)
        rows = "".join("<tr>" + "".join(f"<td>{_cell(cell)}</td>" for cell in row) + "</tr>" for row in shown)
        more = (f'<p class="note">{len(s.rows) - len(shown):,} more rows not shown</p>' if len(s.rows) > len(shown) else "")
        note = f'<p class="note">{_e(s.note)}</p>' if s.note else ""
        return (f'<div class="section" id="{_e(s.key)}"><h3>{_e(s.title)}</h3><table class="data"><thead><tr>{head}'
                f'</tr></thead><tbody>{rows}</tbody></table>{more}{note}</div>')
    if isinstance(s, Chart):
        # plotly's own serialisation escapes '<', '>' and '&' inside the figure's JSON
        div = pio.to_html(s.figure, full_html=False, include_plotlyjs=False, div_id=f"graph-{s.key}",
                          config={"displaylogo": False})
        note = f'<p class="note">{_e(s.note)}</p>' if s.note else ""
        return f'<div class="section" id="{_e(s.key)}">{div}{note}</div>'
    if isinstance(s, Text):
        return f'<p class="{_e(s.kind)}" id="{_e(s.key)}">{_e(s.text)}</p>'
    if isinstance(s, Download):   # made on request by the server; the file has no server
        return ""
    raise TypeError(f"not a report section: {s!r}")


def _cell(cell: str | Link | Details) -> str:
    """A cell as escaped HTML. A link leads to a page of the served report; the file shows no link
    (its target is not here)."""
    if isinstance(cell, Details):
        return (f'<details class="evidence"><summary>{_e(cell.summary)}</summary>'
                f'<pre class="raw">{_e(cell.full)}</pre></details>')
    return "" if isinstance(cell, Link) else _e(cell)


def _e(text) -> str:
    return html.escape(str(text), quote=True)
