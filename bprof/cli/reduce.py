"""`bprof reduce PATH...`: each rank's compact tables as Parquet, for cross-rank analysis at scale;
many traces at once on a local process pool or a Ray cluster (bprof.scale)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bprof.cli.options import JsonOption, print_json
from bprof.store.kineto_file import is_url

EngineOption = typer.Option("local", "--engine", help="Where the reduces run: local (a process pool) or ray.")
AddressOption = typer.Option(None, "--address", help="The Ray cluster to use (what `ray start --head` prints; "
                                                     "default: RAY_ADDRESS, else a local Ray for this command).")


def register(app: typer.Typer) -> None:
    app.command("reduce")(reduce)


def reduce(
    paths: List[str] = typer.Argument(..., help="Rank traces (.json or .json.gz), directories of them, or fsspec URLs "
                                                "(s3://, gs://, hdfs://, file://); bprof record metadata is found beside each."),
    out: Optional[str] = typer.Option(None, "--out", help="Output: for one trace file, the output directory (default: "
                                                          "rank<R>.reduced beside the trace); for several, the folder they go under."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Rank of a trace that does not record it."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="DuckDB threads per reduce (default: one per core)."),
    engine: str = EngineOption,
    address: Optional[str] = AddressOption,
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Reduces at once (default: every CPU the engine has)."),
    force: bool = typer.Option(False, "--force", help="Reduce again where a complete output of the same trace exists."),
    as_json: bool = JsonOption,
) -> None:
    """Reduce rank traces to their steps, collectives, clock samples and per-step partition (zstd
    Parquet); `bprof ingest` loads a run from a directory of these. With several traces, one that
    fails is named (exit 1) and the others are written; a rerun reduces only what is missing."""
    if engine == "local" and address is None and len(paths) == 1 and not is_url(paths[0]) and Path(paths[0]).is_file():
        _reduce_one(Path(paths[0]), out, rank, threads, as_json)
        return
    from bprof.scale.fanout import FanoutOptions, reduce_paths

    err = Console(stderr=True)
    options = FanoutOptions(engine=engine, address=address, workers=workers, out=out, rank=rank, threads=threads,
                            force=force)
    with Progress(TextColumn("reduce"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=as_json or not err.is_terminal) as bar:
        task = bar.add_task("reduce", total=None)
        fanout = reduce_paths(paths, options, progress=lambda done, total: bar.update(task, completed=done, total=total))
    print_fanout(fanout, as_json)


def print_fanout(fanout, as_json: bool) -> None:
    """One line per trace and a total (failures on stderr, one line each); exit 1 if any failed."""
    if as_json:
        print_json([o.summary() for o in fanout.outcomes.values()])
    else:
        for o in fanout.outcomes.values():
            if o.status == "reduced":
                typer.echo(f"reduced rank {o.rank} of {o.trace} into {o.out} in {o.result.seconds:.2f} s")
            elif o.status == "kept":
                typer.echo(f"kept {o.out} (already reduced from {o.trace})")
        typer.echo(f"{fanout.count('reduced')} reduced, {fanout.count('kept')} kept, {len(fanout.failed)} failed "
                   f"of {len(fanout.outcomes)} traces")
    for o in fanout.failed:
        typer.echo(f"bprof: error: {o.error}", err=True)
    if fanout.failed:
        raise typer.Exit(1)


def _reduce_one(trace: Path, out: Optional[str], rank: Optional[int], threads: Optional[int], as_json: bool) -> None:
    """One local trace: reduced in this process, always anew (as before bprof.scale)."""
    from bprof.analyzers.reduce import reduce_trace

    r = reduce_trace(trace, Path(out) if out is not None else None, rank=rank, threads=threads)
    if as_json:
        print_json(r.summary())
        return
    rows = ", ".join(f"{name} {n:,}" for name, n in r.rows.items())
    typer.echo(f"reduced rank {r.rank} of {r.trace} into {r.out} in {r.seconds:.2f} s: {rows} rows; "
               f"{r.reduced_bytes / 1e3:,.1f} kB written, 1/{1 / r.trace_ratio:,.0f} of the trace file "
               f"({r.trace_bytes / 1e6:,.2f} MB; {r.trace_json_bytes / 1e6:,.1f} MB of JSON, {r.num_events:,} events)")
