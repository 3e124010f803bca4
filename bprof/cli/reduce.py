"""`bprof reduce TRACE`: one rank's compact tables as Parquet, for cross-rank analysis at scale."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bprof.cli.options import JsonOption, print_json


def register(app: typer.Typer) -> None:
    app.command("reduce")(reduce)


def reduce(
    trace: Path = typer.Argument(..., help="One rank's trace (.json or .json.gz); its bprof record metadata is found beside it."),
    out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default: rank<R>.reduced beside the trace)."),
    rank: Optional[int] = typer.Option(None, "--rank", help="Rank of a trace that does not record it."),
    threads: Optional[int] = typer.Option(None, "--threads", min=1, help="DuckDB threads (default: one per core)."),
    as_json: bool = JsonOption,
) -> None:
    """Reduce one rank's trace to its steps, collectives, clock samples and per-step partition
    (zstd Parquet); `bprof ingest` loads a run from a directory of these."""
    from bprof.analyzers.reduce import reduce_trace

    r = reduce_trace(trace, out, rank=rank, threads=threads)
    if as_json:
        print_json(r.summary())
        return
    rows = ", ".join(f"{name} {n:,}" for name, n in r.rows.items())
    typer.echo(f"reduced rank {r.rank} of {r.trace} into {r.out} in {r.seconds:.2f} s: {rows} rows; "
               f"{r.reduced_bytes / 1e3:,.1f} kB written, 1/{1 / r.trace_ratio:,.0f} of the trace file "
               f"({r.trace_bytes / 1e6:,.2f} MB; {r.trace_json_bytes / 1e6:,.1f} MB of JSON, {r.num_events:,} events)")
