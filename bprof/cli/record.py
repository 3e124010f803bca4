"""`bprof record [OPTIONS] -- CMD...`: capture every rank of an unmodified job, then ingest it."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from bprof.cli.options import BenchmarkOption, BranchOption, CommitOption, DbOption, TagOption
from bprof.errors import UsageError
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
    hang_timeout: Optional[float] = typer.Option(None, "--hang-timeout", min=0.1, help="When no rank completes an optimizer step for SECONDS: gather every rank's Flight Recorder dump and stacks into RUN/hang, print `bprof hang`'s verdict, end the job, exit 124."),
    watch: bool = typer.Option(False, "--watch", help="Between windows, every rank records each iteration's step, busy, data-wait, GC and blocked-collective time (RUN/watch); the record process scores ranks against their peers live and opens a trace window on every rank when a rank or the step goes wrong (docs/watch.md)."),
    metrics_port: Optional[int] = typer.Option(None, "--metrics-port", min=0, max=65535, help="With --watch: serve the live metrics in Prometheus's text format on this port (0: any free one)."),
    metrics_addr: str = typer.Option("0.0.0.0", "--metrics-addr", help="With --metrics-port: the address to listen on."),
    watch_trigger: bool = typer.Option(True, "--watch-trigger/--no-watch-trigger", help="With --watch: open trace windows when a rule fires (off: only score and say)."),
    watch_max_windows: int = typer.Option(4, "--watch-max-windows-per-hour", min=0, help="With --watch: at most this many triggered windows in any hour."),
    watch_flush_every: int = typer.Option(10, "--watch-flush-every", min=1, help="With --watch: iterations each rank keeps before writing them (also written every 2 s)."),
    db: Path = DbOption,
    ingest: bool = typer.Option(True, "--ingest/--no-ingest", help="Ingest the run into the store afterwards."),
    benchmark: Optional[str] = BenchmarkOption,
    tag: Optional[List[str]] = TagOption,
    branch: Optional[str] = BranchOption,
    commit: Optional[str] = CommitOption,
) -> None:
    """Run CMD (torchrun, python -m torch.distributed.run, python, ...) with every rank profiled."""
    command = tuple(ctx.args)
    if metrics_port is not None and not watch:
        raise UsageError("--metrics-port serves --watch's live metrics: add --watch")
    watching = None
    if watch:
        from bprof.watch.live import WatchOptions

        watching = WatchOptions(trigger=watch_trigger, max_windows_per_hour=watch_max_windows,
                                flush_every=watch_flush_every)
    result = run_recording(RecordOptions(command=command, out=out, name=name, steps=steps, memory=memory,
                                         execution_trace=execution_trace, model_flops=model_flops, reduce=reduce,
                                         hang_timeout_s=hang_timeout, watch=watching, metrics_port=metrics_port,
                                         metrics_addr=metrics_addr))
    if watch:
        _watched(result)
    ingested = False
    try:
        _captured(result, steps, reduce, ingest, db, name, benchmark, tag, branch, commit)
        ingested = ingest
    finally:
        if result.hung or result.dead_ranks:
            # after the ingest: the verdict joins the straggler analysis of a window captured before,
            # and goes into the store (not when the ingest failed: the verdict is printed all the same)
            from bprof.cli.hang import print_hang

            print_hang(result.run_dir, result.hung, db if ingested else None)
    raise typer.Exit(result.exit_code)


def _watched(result) -> None:
    """What --watch saw: iterations scored, windows it opened and why."""
    live = result.watch or {}
    triggers = live.get("triggers") or []
    typer.echo(f"bprof watch: {live.get('newest_complete_iteration', -1) + 1} iterations reported by every rank; "
               f"{len(triggers)} window(s) opened by the watch", err=True)
    for t in triggers:
        typer.echo(f"bprof watch:   window {t['start']}:{t['start'] + t['steps']} (seen at iteration {t['seen_at']}): "
                   f"{t['reason']}", err=True)


def _captured(result, steps: str, reduce: bool, ingest: bool, db: Path, name, benchmark, tag, branch, commit) -> None:
    """Say what was captured, and ingest it (a watched job's series even when it opened no window)."""
    from bprof.store.ingest_watch import ingest_recordings, is_watched, watch_line

    watched = is_watched(result.run_dir)
    if not result.ranks_with_traces:
        typer.echo(f"bprof: nothing was captured (the command exited with {result.exit_code} before any "
                   f"window of --steps {steps}{', and the watch opened none' if watched else ''}); run directory "
                   f"{result.run_dir}" + ("; its watch series is ingested" if watched and ingest else ""), err=True)
        if not (watched and ingest):
            return
    else:
        typer.echo(f"bprof: recorded ranks {_ranks(result.ranks_with_traces)} over windows "
                   f"{', '.join(result.windows)} into {result.run_dir}", err=True)
    if reduce and result.ranks_with_traces:
        _reduced_summary(result.run_dir)
    if ingest:
        con = open_store(db)
        try:
            results, series = ingest_recordings(con, [result.run_dir], IngestOptions(
                    name=name if len(result.windows) == 1 else None, benchmark=benchmark, tags=tuple(tag or ()),
                    git_branch=branch, git_sha=commit))
            for r in results:
                for warning in r.warnings:
                    typer.echo(f"bprof: warning: run {r.name}: {warning}", err=True)
                typer.echo(f"bprof: ingested run {r.run_id} ({r.name}): {r.num_ranks} ranks, "
                           f"{r.num_events:,} events into {db}", err=True)
                _summary(con, r.run_id)
            for w in series:
                typer.echo(f"bprof: {watch_line(w, db)}", err=True)
        finally:
            con.close()


def _summary(con, run_id: int) -> None:
    """Steps captured per rank and their time (the time split joins once analysis exists)."""
    from rich.console import Console

    from bprof.cli.tables import Grid

    table = Grid("rank", "host", "steps", "median step", "slowest step", title=f"run {run_id}")
    for rank, host, steps, median_ns, max_ns in con.execute("""
            SELECT k.rank, k.host, list(s.step ORDER BY s.step), median(coalesce(s.device_dur_ns, s.dur_ns)),
                max(coalesce(s.device_dur_ns, s.dur_ns))
            FROM ranks k LEFT JOIN steps s USING (run_id, rank) WHERE k.run_id = ? GROUP BY ALL ORDER BY k.rank""",
            [run_id]).fetchall():
        shown = f"{steps[0]}-{steps[-1]}" if steps and steps[0] is not None else "none"
        table.add_row(str(rank), host or "", shown, _ms(median_ns), _ms(max_ns))
    table.print(Console(stderr=True))


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
