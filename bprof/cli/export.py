"""`bprof export RUN --parquet DIR`: the way out when a run outgrows one machine."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bprof.cli.options import DbOption, JsonOption, RunArgument, print_json
from bprof.errors import UsageError
from bprof.store.db import open_store
from bprof.store.export import export_parquet
from bprof.store.runs import resolve_run


def register(app: typer.Typer) -> None:
    app.command("export")(export)


def export(
    run: Optional[str] = RunArgument,
    parquet: Optional[Path] = typer.Option(None, "--parquet", help="Write hive-partitioned Parquet (table/run=/rank=) here."),
    db: Path = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Export a run's tables."""
    if parquet is None:
        raise UsageError("say where to export: --parquet DIR")
    con = open_store(db, read_only=True)
    try:
        run_id = resolve_run(con, run)
        counts = export_parquet(con, run_id, parquet)
    finally:
        con.close()
    if as_json:
        print_json({"run": run_id, "dir": str(parquet), "rows": counts})
    else:
        typer.echo(f"exported run {run_id} to {parquet}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
