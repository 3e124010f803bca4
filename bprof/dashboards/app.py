"""`bprof report --serve`: a Dash app over the store, read-only.

Every callback opens its own read-only connection, reads what the analyzers wrote and renders the
sections of one page (pages/); nothing is computed here and nothing is cached between requests, so
a store analysed again shows its new tables on the next click. Trace-derived text (kernel and op
names) goes into components as text, which React escapes; no query is built from user input.
"""

from __future__ import annotations

import sys
import tempfile
import traceback
from pathlib import Path

import duckdb
from dash import Dash, Input, Output, State, ctx, dcc, html, no_update

from bprof.dashboards.pages import PAGES, page_for
from bprof.dashboards.pages.defaults import with_defaults
from bprof.dashboards.read import rank_choices, run_ids, steps
from bprof.dashboards.sections import (MAX_TABLE_ROWS, Chart, Details, Download, Link, Numbers, Section, Table, Text, View, css,
                                       view_from_query)
from bprof.errors import BprofError
from bprof.store.db import open_store

CONTROLS = ("run", "step", "ranks", "base")
# The rank picker lists the chosen ranks and at most this many others: the first ranks, or those
# whose number or host matches what the reader types (any rank of a 10,000-rank run is reachable).
MAX_RANK_OPTIONS = 200


def create_app(db: Path, run_id: int | None = None) -> Dash:
    """The report app over the store at `db`; `run_id` is the run shown first (default: the latest)."""
    db = Path(db)
    with _connect(db) as con:
        runs = run_ids(con)
    first = run_id if run_id is not None else (runs[0][0] if runs else None)
    app = Dash(__name__, title="bprof report", compress=True, update_title=None, suppress_callback_exceptions=True)
    app.index_string = app.index_string.replace("{%css%}", "{%css%}<style>" + css() + "</style>")
    run_options = [{"label": f"{rid} {name}", "value": rid} for rid, name in runs]
    app.layout = html.Div([
        dcc.Location(id="url"),
        html.Header([html.Span("bprof", className="brand"),
                     *[dcc.Link(p.TITLE, href=p.PATH, id=f"nav-{p.__name__.rsplit('.', 1)[-1]}") for p in PAGES]]),
        html.Div(className="controls", children=[
            _control("run", "run", dcc.Dropdown(id="run", options=run_options, value=first, clearable=False)),
            _control("step", "step", dcc.Dropdown(id="step", clearable=False)),
            _control("ranks", "ranks", dcc.Dropdown(id="ranks", multi=True)),
            _control("base", "compare with", dcc.Dropdown(id="base")),
        ]),
        html.Main(dcc.Loading(html.Div(id="page"), delay_show=300)),
        dcc.Download(id="download"),
    ])

    def rank_labels(con, run, chosen, typed) -> list[dict]:
        return [{"label": f"{r} ({h})" if h else str(r), "value": r}
                for r, h in rank_choices(con, run, list(chosen or []), typed or "", MAX_RANK_OPTIONS)]

    @app.callback(Output("run", "value"), Input("url", "search"))
    def run_from_url(search):
        """A link with ?run=N (a finding's evidence, a shared URL) chooses that run."""
        return view_from_query(search).get("run", no_update)

    @app.callback(Output("step", "options"), Output("step", "value"), Output("ranks", "options"),
                  Output("ranks", "value"), Output("base", "options"), Output("base", "value"),
                  Input("run", "value"), Input("url", "search"), State("step", "options"))
    def choose_run(run, search, filled):
        """The controls of a run: its steps and ranks, with the step and ranks a link's query names
        (?step=5&ranks=3,7) or else the defaults; a new run chosen by hand starts from the defaults."""
        query = view_from_query(search)
        if ctx.triggered_id == "url" and filled and (not query or query.get("run", run) != run):
            return (no_update,) * 6   # plain navigation keeps the choices; another run: run_from_url sets it first
        if query.get("run", run) != run:
            query = {}
        if run is None:
            return [], None, [], [], [], None
        with _connect(db) as con:
            view = with_defaults(con, View(run, query.get("step"), tuple(query.get("ranks", ()))))
            step_list = steps(con, run)
            others = [(rid, name) for rid, name in run_ids(con) if rid != run]
            # the ranks go out with their options: a value missing from the options is dropped
            rank_options = rank_labels(con, run, view.ranks, "")
        chosen = [r for r in view.ranks if r in {o["value"] for o in rank_options}]
        base = next((rid for rid, _ in others if rid < run), others[0][0] if others else None)
        return ([{"label": str(s), "value": s} for s in step_list], view.step, rank_options, chosen,
                [{"label": f"{rid} {name}", "value": rid} for rid, name in others], base)

    @app.callback(Output("ranks", "options", allow_duplicate=True), Input("ranks", "search_value"),
                  State("run", "value"), State("ranks", "value"), prevent_initial_call=True)
    def search_ranks(typed, run, chosen):
        if run is None:
            return []
        with _connect(db) as con:
            return rank_labels(con, run, chosen, typed)

    @app.callback(*[Output(f"control-{c}", "style") for c in CONTROLS],
                  *[Output(f"nav-{p.__name__.rsplit('.', 1)[-1]}", "className") for p in PAGES],
                  Input("url", "pathname"))
    def show_controls(path):
        page = page_for(path)
        used = page.CONTROLS if page else ()
        return (*[{} if c in used else {"display": "none"} for c in CONTROLS],
                *["active" if p is page else "" for p in PAGES])

    @app.callback(Output("page", "children"), Input("url", "pathname"), Input("run", "value"),
                  Input("step", "value"), Input("ranks", "value"), Input("base", "value"))
    def show_page(path, run, step, chosen_ranks, base):
        page = page_for(path)
        if page is None:
            return html.P(f"no page at {path}", className="warning", id="not-found")
        if run is None and page.CONTROLS:
            return html.P("the store has no runs yet (run `bprof ingest PATH` first)", className="warning", id="no-runs")
        try:
            with _connect(db) as con:
                view = with_defaults(con, View(run, step, tuple(chosen_ranks or ()), base))
                return [html.H2(page.TITLE), *render(page.sections(con, view))]
        except (BprofError, duckdb.Error) as exc:
            return html.P(f"cannot show this page: {exc}", className="warning", id="page-error")
        except Exception as exc:  # a bug: keep the server up, show it, and log the traceback
            traceback.print_exc(file=sys.stderr)
            return html.P(f"internal error drawing this page: {type(exc).__name__}: {exc}", className="warning",
                          id="page-error")

    @app.callback(Output("download", "data"), Output("download-message", "children"), Input("download-button", "n_clicks"),
                  State("download-spec", "data"), prevent_initial_call=True)
    def download(clicks, spec):
        """A Download section's file, made now from the store (read-only) and sent once."""
        if not clicks or not spec or spec.get("kind") != "perfetto":
            return no_update, no_update
        from bprof.dashboards.perfetto import export_perfetto

        try:
            # the spec comes back from the browser: only its numbers are used, the file name is made here
            run, step, chosen = int(spec["params"]["run"]), int(spec["params"]["step"]), [int(r) for r in spec["params"]["ranks"]]
        except (KeyError, TypeError, ValueError):
            return no_update, "cannot export: not a run, step and ranks"
        filename = f"bprof-run{run}-step{step}.json.gz"
        try:
            with tempfile.TemporaryDirectory(prefix="bprof-report-") as tmp, _connect(db) as con:
                path = Path(tmp) / filename
                written = export_perfetto(con, run, path, step=step, ranks=chosen)
                data = dcc.send_bytes(path.read_bytes(), filename)
        except BprofError as exc:
            return no_update, f"cannot export: {exc}"
        return data, f"{written['events']:,} events, {written['flows']:,} collectives linked"

    return app


def render(sections: list[Section]) -> list:
    """Dash components for a page's sections; every text is a text child, never markup."""
    out = []
    for s in sections:
        if isinstance(s, Numbers):
            out.append(html.Div(id=s.key, className="numbers", children=[
                html.Div(className="item", children=[html.Span(label, className="label"),
                                                     html.Span(text, className="value", id=f"{s.key}-{key}")])
                for key, label, text in s.items]))
        elif isinstance(s, Table):
            shown = s.rows[:MAX_TABLE_ROWS]
            body = [html.Tr([html.Td(_cell(cell)) for cell in row]) for row in shown]
            out.append(html.Div(id=s.key, className="section", children=[
                html.H3(s.title),
                html.Table(className="data", children=[html.Thead(html.Tr([html.Th(c) for c in s.columns])),
                                                       html.Tbody(body)]),
                *([html.P(f"{len(s.rows) - len(shown):,} more rows not shown", className="note")]
                  if len(s.rows) > len(shown) else []),
                *([html.P(s.note, className="note")] if s.note else [])]))
        elif isinstance(s, Chart):
            out.append(html.Div(id=s.key, className="section", children=[
                dcc.Graph(id=f"graph-{s.key}", figure=s.figure, config={"displaylogo": False}),
                *([html.P(s.note, className="note")] if s.note else [])]))
        elif isinstance(s, Text):
            out.append(html.P(s.text, id=s.key, className=s.kind))
        elif isinstance(s, Download):
            out.append(html.Div(id=s.key, className="section", children=[
                html.Button(s.label, id="download-button", n_clicks=0),
                html.Span(id="download-message", className="note"),
                dcc.Store(id="download-spec", data={"kind": s.kind, "params": s.params})]))
    return out


def _cell(cell):
    """A table cell as a Dash component: text, a link to another page, or a summary with its full text on demand."""
    if isinstance(cell, Link):
        return dcc.Link(cell.text, href=cell.href())
    if isinstance(cell, Details):
        return html.Details(className="evidence", children=[html.Summary(cell.summary), html.Pre(cell.full, className="raw")])
    return cell


def _control(name: str, label: str, component) -> html.Div:
    return html.Div(id=f"control-{name}", className="control", children=[html.Label(label), component])


def _connect(db: Path) -> duckdb.DuckDBPyConnection:
    return open_store(db, read_only=True)
