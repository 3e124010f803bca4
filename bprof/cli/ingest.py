"""`bprof ingest PATH...`: load per-rank Kineto traces (or `bprof reduce` outputs) into the store."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bprof.cli.reduce import AddressOption
from bprof.cli.options import BenchmarkOption, BranchOption, CommitOption, DbOption, JsonOption, TagOption, print_json
from bprof.errors import UsageError
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions
from bprof.store.ingest_watch import ingest_recordings, watch_line
from bprof.store.kineto_file import is_url


def register(app: typer.Typer) -> None:
    app.command("ingest")(ingest)


def ingest(
    paths: List[str] = typer.Argument(..., help="Trace files or directories (one run; torchtitan iteration_N folders: one run each), "
                                                 "or rank<R>.reduced outputs of bprof reduce (or a directory of them); "
                                                 "with --engine, fsspec URLs (s3://, gs://, hdfs://) too."),
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
    engine: Optional[str] = typer.Option(None, "--engine", help="Reduce each trace first (bprof reduce) on local (a process "
                                                                "pool) or ray, then ingest the reduced outputs (no events)."),
    address: Optional[str] = AddressOption,
    out: Optional[str] = typer.Option(None, "--out", help="With --engine: the folder the reduced outputs go under "
                                                          "(default: beside each trace)."),
    as_json: bool = JsonOption,
) -> None:
    """Ingest traces into the store; a file that fails leaves the store as it was. With --engine, a
    trace whose reduce fails is named (exit 1) and the run is ingested without it."""
    if engine is None and (address is not None or out is not None):
        raise UsageError("--address and --out belong to --engine (reduce first, then ingest)")
    if engine is None and any(is_url(p) for p in paths):
        raise UsageError(f"{next(p for p in paths if is_url(p))}: a URL is ingested through its reduce: add --engine local or ray")
    err = Console(stderr=True)
    fanout, watched = None, []
    if engine is not None:
        from bprof.scale.fanout import FanoutOptions, reduce_paths

        with Progress(TextColumn("reduce"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True, disable=as_json or not err.is_terminal) as bar:
            task = bar.add_task("reduce", total=None)
            fanout = reduce_paths(paths, FanoutOptions(engine=engine, address=address, out=out, rank=rank),
                                  progress=lambda done, total: bar.update(task, completed=done, total=total))
    con = open_store(db)
    try:
        with Progress(TextColumn("ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err, transient=True, disable=as_json or not err.is_terminal) as bar:
            task = bar.add_task("ingest", total=None)
            options = IngestOptions(name=name, rank=rank, workers=workers, reduced=reduced, benchmark=benchmark,
                                    tags=tuple(tag or ()), git_branch=branch, git_sha=commit)
            if fanout is not None:
                from bprof.scale.fanout import ingest_fanout

                results = ingest_fanout(con, fanout, replace(options, rank=None))
            else:
                results, watched = ingest_recordings(con, [Path(p) for p in paths], options,
                                                     progress=lambda done, total: bar.update(task, completed=done, total=total))
    finally:
        con.close()
    if as_json:
        print_json({"runs": [r.summary() for r in results], "watch": [w.summary() for w in watched]} if watched else
                   [r.summary() for r in results] if fanout is None else
                   {"runs": [r.summary() for r in results], "traces": [o.summary() for o in fanout.outcomes.values()]})
    else:
        _print_results(results, db, err)
        for w in watched:
            typer.echo(watch_line(w, db))
    if fanout is not None:
        for o in fanout.failed:
            typer.echo(f"bprof: error: {o.error}", err=True)
        if fanout.failed:
            raise typer.Exit(1)


def _print_results(results, db: Path, err: Console) -> None:
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
