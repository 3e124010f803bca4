"""`bprof export RUN --parquet DIR | --perfetto FILE | --prometheus FILE`: the way out of the store, for
scale-out (Parquet), for looking at one step in Perfetto, or a watched run's metrics for Prometheus."""

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
    perfetto: Optional[Path] = typer.Option(None, "--perfetto", help="Write one step as a Chrome-trace JSON (.json or "
                                                                     ".json.gz) for ui.perfetto.dev; it re-ingests."),
    step: Optional[int] = typer.Option(None, "--step", help="--perfetto: the step (default: the step of median length)."),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="--perfetto: ranks as 0,1,2 or 0-7,16 "
                                                              "(default: all, at most 64)."),
    prometheus: Optional[Path] = typer.Option(None, "--prometheus", help="Write a watched recording's metrics (of a "
                                              "window run, or watch-<dir>) in Prometheus's text format, as "
                                              "bprof record --watch --metrics-port serves them."),
    db: Path = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Export a run's tables (--parquet), one step of its ranks (--perfetto) or its watch metrics (--prometheus)."""
    if sum(x is not None for x in (parquet, perfetto, prometheus)) != 1:
        raise UsageError("say where to export: --parquet DIR, --perfetto FILE or --prometheus FILE (one of them)")
    if prometheus is not None:
        if step is not None or ranks is not None:
            raise UsageError("--step and --ranks apply to --perfetto only")
        _prometheus(run, db, prometheus, as_json)
        return
    if parquet is not None and (step is not None or ranks is not None):
        raise UsageError("--step and --ranks apply to --perfetto only")
    chosen = parse_ranks(ranks) if ranks is not None else None
    con = open_store(db, read_only=True)
    try:
        run_id = resolve_run(con, run)
        if perfetto is not None:
            from bprof.dashboards.perfetto import export_perfetto

            written = export_perfetto(con, run_id, perfetto, step=step, ranks=chosen)
        else:
            counts = export_parquet(con, run_id, parquet)
    finally:
        con.close()
    if perfetto is not None:
        if as_json:
            print_json(written)
            return
        typer.echo(f"exported step {written['step']} of run {run_id}, ranks {_ranges(written['ranks'])}, to {perfetto}: "
                   f"{written['events']:,} events, {written['flows']:,} collectives linked, {written['bytes']:,} bytes "
                   "(open it in https://ui.perfetto.dev)")
        if written["unaligned_ranks"]:
            typer.echo(f"warning: ranks {_ranges(written['unaligned_ranks'])} are on their own clock: clock alignment "
                       "found no offset for their host", err=True)
    elif as_json:
        print_json({"run": run_id, "dir": str(parquet), "rows": counts})
    else:
        typer.echo(f"exported run {run_id} to {parquet}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))


def _prometheus(run: Optional[str], db: Path, path: Path, as_json: bool) -> None:
    from bprof.analyzers.between import resolve
    from bprof.store.watch_metrics import write_prometheus

    con = open_store(db, read_only=True)
    try:
        run_id, recording_id = resolve(con, run)
        if recording_id is None:
            raise UsageError(f"run {run_id} has no watch series (record with bprof record --watch)")
        written = write_prometheus(con, recording_id, path)
    finally:
        con.close()
    if as_json:
        print_json(written)
    else:
        typer.echo(f"exported the watch metrics of recording {recording_id} (run label {written['run']}) to {path}: "
                   f"{written['samples']:,} samples, {written['bytes']:,} bytes")


def parse_ranks(text: str) -> list[int]:
    """'0,1,4-7' -> [0, 1, 4, 5, 6, 7]; a usage error for anything else."""
    out = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        if not lo.isdigit() or dash and not hi.isdigit():
            raise UsageError(f"--ranks {text!r}: expected ranks such as 0,1,2 or 0-7")
        if dash and int(hi) < int(lo):
            raise UsageError(f"--ranks {text!r}: the range {part} is empty")
        out.extend(range(int(lo), int(hi) + 1) if dash else [int(lo)])
        if len(out) > 1 << 20:
            raise UsageError(f"--ranks {text!r}: too many ranks")
    return sorted(set(out))


def _ranges(ranks: list[int]) -> str:
    from bprof.store.ingest import rank_ranges

    return rank_ranges(ranks)
