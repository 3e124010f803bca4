"""`bprof runs` and `bprof info RUN`: what the store holds."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from bprof.cli.options import DbOption, JsonOption, RunArgument, print_json
from bprof.cli.tables import Grid
from bprof.store.db import open_store
from bprof.store.runs import list_runs, resolve_run, run_info


def register(app: typer.Typer) -> None:
    app.command("runs")(runs)
    app.command("info")(info)


def runs(db: Path = DbOption, as_json: bool = JsonOption) -> None:
    """List the runs in the store."""
    con = open_store(db, read_only=True)
    try:
        rows = list_runs(con)
    finally:
        con.close()
    if as_json:
        print_json(rows)
        return
    table = Grid("id", "name", "started", "ranks", "backend", "device", "steps", "median step", "consistent")
    for r in rows:
        table.add_row(str(r["id"]), r["name"], (r["started_at"] or "")[:19],
                      f"{r['num_ranks_ingested']}/{r['world_size'] or '?'}", r["backend"] or "", r["device_name"] or "",
                      str(r["num_steps"]), _ms(r["median_step_ns"]), "yes" if r["consistent"] else "no")
    table.print(Console())


def info(run: Optional[str] = RunArgument, db: Path = DbOption, as_json: bool = JsonOption) -> None:
    """Describe one run: ranks, devices, steps, events by kind, collectives by op."""
    con = open_store(db, read_only=True)
    try:
        data = run_info(con, resolve_run(con, run))
    finally:
        con.close()
    if as_json:
        print_json(data)
        return
    console = Console()
    console.print(f"[bold]run {data['id']}[/bold] {data['name']}  started {data['started_at']}  "
                  f"backend {data['backend']}  world size {data['world_size']}  "
                  f"ranks ingested {data['num_ranks_ingested']}")
    if not data["consistent"]:
        console.print(f"[yellow]inconsistent[/yellow]: {data['inconsistency']}")
    ranks = Grid("rank", "host", "device", "events", "steps", "trace")
    for r in data["ranks"]:
        steps = r["steps"] or []
        ranks.add_row(str(r["rank"]), r["host"] or "", r["device_name"] or "", f"{r['num_events']:,}",
                      f"{steps[0]}-{steps[-1]} ({len(steps)})" if steps else "none", r["trace_path"])
    ranks.print(console)
    kinds = Grid("event kind", "count")
    for kind, count in data["events_by_kind"].items():
        kinds.add_row(kind, f"{count:,}")
    kinds.print(console)
    colls = Grid("collective", "process group", "ranks", "calls", "in bytes")
    for c in data["collectives_by_op"]:
        colls.add_row(c["op"], c["pg_desc"] or "?", str(c["pg_ranks"] or "?"), str(c["calls"]),
                      f"{c['in_bytes']:,}" if c["in_bytes"] is not None else "?")
    colls.print(console)


def _ms(ns) -> str:
    return "" if ns is None else f"{ns / 1e6:.2f} ms"
