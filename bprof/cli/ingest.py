"""`bprof ingest PATH...`: load per-rank Kineto traces (or `bprof reduce` outputs) into the store."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bprof.cli.options import BenchmarkOption, BranchOption, CommitOption, DbOption, JsonOption, TagOption, print_json
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)


def ingest(
    paths: List[Path] = typer.Argument(..., help="Trace files or directories (one run; torchtitan iteration_N folders: one run each), "
                                                  "or rank<R>.reduced outputs of bprof reduce (or a directory of them)."),
    db: Path = DbOption,
    name: Optional[str] = typer.Option(None, "--name", help="Run name (default: the directory name)."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Rank of a single trace that does not record it."),
    workers: int = typer.Option(2, "--workers", min=1, help="Threads inflating trace files."),
    reduced: bool = typer.Option(False, "--reduced", help="Where a directory holds traces and bprof reduce outputs "
                                                           "(bprof record --reduce), ingest the reduced outputs."),
    benchmark: Optional[str] = BenchmarkOption,
    tag: Optional[List[str]] = TagOption,
    branch: Optional[str] = BranchOption,
    commit: Optional[str] = CommitOption,
    as_json: bool = JsonOption,
) -> None:
    """Ingest traces into the store; a file that fails leaves the store as it was."""
    err = Console(stderr=True)
    con = open_store(db)
    try:
        with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True, disable=as_json or not err.is_terminal) as bar:
            task = bar.add_task("ingest", total=None)
            options = IngestOptions(name=name, rank=rank, workers=workers, reduced=reduced, benchmark=benchmark,
                                    tags=tuple(tag or ()), git_branch=branch, git_sha=commit)
            results = ingest_paths(con, paths, options,
                                   progress=lambda done, total: bar.update(task, completed=done, total=total))
    finally:
        con.close()
    if as_json:
        print_json([r.summary() for r in results])
        return
    for r in results:
        for warning in r.warnings:
            err.print(f"[yellow]warning[/yellow]: run {r.name}: {warning}")
        if r.created and r.reduced_bytes:
            typer.echo(f"ingested run {r.run_id} ({r.name}) from reduced outputs: {r.num_ranks} ranks, "
                       f"{r.reduced_bytes / 1e3:,.1f} kB of Parquet into {db} (no events: per-rank views need the traces)")
        elif r.created:
            typer.echo(f"ingested run {r.run_id} ({r.name}): {r.num_ranks} ranks, {r.num_events:,} events, "
                       f"{r.uncompressed_bytes / 1e6:,.1f} MB of trace JSON into {db}")
        else:
            typer.echo(f"already ingested as run {r.run_id} ({r.name}); nothing changed in {db}")
