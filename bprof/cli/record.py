"""`bprof record [OPTIONS] -- CMD...`: capture every rank of an unmodified job, then ingest it."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from bprof.cli.options import BenchmarkOption, BranchOption, CommitOption, DbOption, TagOption
from bprof.profiler.launcher import RecordOptions, record as run_recording
from bprof.profiler.windows import DEFAULT_WINDOWS
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths


def register(app: typer.Typer) -> None:
    app.command("record", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(record)


def record(
    ctx: typer.Context,
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default: bprof_runs/<name or run id>)."),
    name: Optional[str] = typer.Option(None, "--name", help="Run name."),
    steps: str = typer.Option(DEFAULT_WINDOWS, "--steps", help="Iterations to capture, half-open: 10:15 or 10:15,5000:5005."),
    memory: bool = typer.Option(False, "--memory", help="Also record memory events."),
    execution_trace: bool = typer.Option(False, "--execution-trace", help="Also write PyTorch's execution trace (Chakra)."),
    model_flops: Optional[float] = typer.Option(None, "--model-flops", help="Model FLOPs per step, when the script does not declare them."),
    reduce: bool = typer.Option(False, "--reduce", help="Each rank also writes `bprof reduce` of its trace (rank<R>.reduced beside it)."),
    db: Path = DbOption,
    ingest: bool = typer.Option(True, "--ingest/--no-ingest", help="Ingest the run into the store afterwards."),
    benchmark: Optional[str] = BenchmarkOption,
    tag: Optional[List[str]] = TagOption,
    branch: Optional[str] = BranchOption,
    commit: Optional[str] = CommitOption,
) -> None:
    """Run CMD (torchrun, python -m torch.distributed.run, python, ...) with every rank profiled."""
    command = tuple(ctx.args)
    result = run_recording(RecordOptions(command=command, out=out, name=name, steps=steps, memory=memory,
                                         execution_trace=execution_trace, model_flops=model_flops, reduce=reduce))
    if not result.ranks_with_traces:
        typer.echo(f"bprof: nothing was captured (the command exited with {result.exit_code} before any "
                   f"window of --steps {steps}); run directory {result.run_dir}", err=True)
        raise typer.Exit(result.exit_code)
    typer.echo(f"bprof: recorded ranks {_ranks(result.ranks_with_traces)} over windows "
               f"{', '.join(result.windows)} into {result.run_dir}", err=True)
    if reduce:
        _reduced_summary(result.run_dir)
    if ingest:
        con = open_store(db)
        try:
            for r in ingest_paths(con, [result.run_dir], IngestOptions(
                    name=name if len(result.windows) == 1 else None, benchmark=benchmark, tags=tuple(tag or ()),
                    git_branch=branch, git_sha=commit)):
                for warning in r.warnings:
                    typer.echo(f"bprof: warning: run {r.name}: {warning}", err=True)
                typer.echo(f"bprof: ingested run {r.run_id} ({r.name}): {r.num_ranks} ranks, "
                           f"{r.num_events:,} events into {db}", err=True)
                _summary(con, r.run_id)
        finally:
            con.close()
    raise typer.Exit(result.exit_code)


def _summary(con, run_id: int) -> None:
    """Steps captured per rank and their time (the time split joins once analysis exists)."""
    from rich.console import Console
    from rich.table import Table

    table = Table("rank", "host", "steps", "median step", "slowest step", title=f"run {run_id}")
    for rank, host, steps, median_ns, max_ns in con.execute("""
            SELECT k.rank, k.host, list(s.step ORDER BY s.step), median(s.dur_ns), max(s.dur_ns)
            FROM ranks k LEFT JOIN steps s USING (run_id, rank) WHERE k.run_id = ? GROUP BY ALL ORDER BY k.rank""",
            [run_id]).fetchall():
        shown = f"{steps[0]}-{steps[-1]}" if steps and steps[0] is not None else "none"
        table.add_row(str(rank), host or "", shown, _ms(median_ns), _ms(max_ns))
    Console(stderr=True).print(table)


def _reduced_summary(run_dir: Path) -> None:
    """How many traces the ranks reduced, and to what size (a failed reduce was warned about by its rank)."""
    traces = list(run_dir.glob("traces/iteration_*/rank*.json.gz"))
    reduced = [d for d in run_dir.glob("traces/iteration_*/rank*.reduced") if (d / "manifest.json").exists()]
    trace_bytes = sum(p.stat().st_size for p in traces)
    reduced_bytes = sum(f.stat().st_size for d in reduced for f in d.iterdir())
    ratio = f", 1/{trace_bytes / reduced_bytes:,.0f} of the traces" if reduced_bytes else ""
    typer.echo(f"bprof: {len(reduced)} of {len(traces)} traces reduced ({reduced_bytes / 1e3:,.1f} kB{ratio}); "
               f"to ingest them instead of the traces: bprof ingest --reduced {run_dir}", err=True)


def _ms(ns) -> str:
    return "" if ns is None else f"{ns / 1e6:.1f} ms"


def _ranks(ranks: list[int]) -> str:
    return f"{ranks[0]}-{ranks[-1]}" if len(ranks) > 1 and ranks == list(range(ranks[0], ranks[-1] + 1)) else str(ranks)
