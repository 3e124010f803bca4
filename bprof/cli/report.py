"""`bprof report [RUN] --serve | --html FILE`: the web report over the store, or one offline HTML file."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bprof.cli.options import DbOption, JsonOption, RunArgument, print_json
from bprof.errors import UsageError
from bprof.store.db import NeedsMigration, open_store
from bprof.store.runs import resolve_run


def register(app: typer.Typer) -> None:
    app.command("report")(report)


def report(
    run: Optional[str] = RunArgument,
    db: Path = DbOption,
    serve: bool = typer.Option(False, "--serve", help="Serve the Dash web report (read-only over the store)."),
    html_file: Optional[Path] = typer.Option(None, "--html", help="Write one self-contained HTML file (works offline)."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind with --serve; 0.0.0.0 exposes the store's "
                                                         "contents to the network."),
    port: int = typer.Option(8050, "--port", help="Port with --serve."),
    as_json: bool = JsonOption,
) -> None:
    """Show a run: a web report (--serve) or an HTML file (--html FILE)."""
    if serve == (html_file is not None):
        raise UsageError("say how to show the report: --serve, or --html FILE")
    if not 0 < port < 65536:
        raise UsageError(f"--port must be between 1 and 65535, got {port}")
    con = _open_read_only(db)
    try:
        run_id = resolve_run(con, run) if (run is not None or html_file is not None) else None
        if html_file is not None:
            from bprof.dashboards.export_html import export_html

            if not html_file.parent.exists():
                raise UsageError(f"{html_file.parent}: no such directory")
            written = export_html(con, run_id, html_file)
    finally:
        con.close()
    if html_file is not None:
        if as_json:
            print_json(written)
        else:
            typer.echo(f"wrote {written['path']}: {', '.join(written['pages'])} ({written['charts']} charts, "
                       f"{written['bytes'] / 1e6:.1f} MB)")
        return
    from bprof.dashboards.app import create_app

    typer.echo(f"bprof report: http://{host}:{port}/  (store {db}, read-only; Ctrl-C stops)")
    create_app(db, run_id).run(host=host, port=port, debug=False)


def _open_read_only(db: Path):
    """The store, read-only; a store an older bprof wrote is first migrated once, as any writing
    command would (the report and its callbacks only read)."""
    try:
        return open_store(db, read_only=True)
    except NeedsMigration:
        open_store(db).close()
    return open_store(db, read_only=True)
