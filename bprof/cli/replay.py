"""`bprof replay [RUN]`: rerun a run's suspicious ops and collectives here, with fix variants, and store the results."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.console import Console
from rich.markup import escape

from bprof.cli.options import DbOption, JsonOption, RunArgument, print_json, open_existing_store
from bprof.cli.tables import Grid
from bprof.replay.results import verdict_text
from bprof.replay.run import VARIANTS, ReplayOptions, replay as run_replay


def register(app: typer.Typer) -> None:
    app.command("replay")(replay)


def replay(
    run: Optional[str] = RunArgument,
    db: Path = DbOption,
    top: int = typer.Option(5, "--top", help="Op signatures and collectives to replay (those findings name first, then by traced time)."),
    op: Optional[str] = typer.Option(None, "--op", help="Replay the signatures of this op only (e.g. aten::mm); no collectives."),
    collectives: bool = typer.Option(False, "--collectives", help="Replay collectives only."),
    variant: Optional[List[str]] = typer.Option(
        None, "--variant", help=f"Fix variant to verify ({', '.join(VARIANTS)}); repeat for several. Default: all that apply."),
    device: Optional[str] = typer.Option(None, "--device", help="cpu or cuda (default: the kind the run was traced on)."),
    repeats: int = typer.Option(7, "--repeats", help="Timed repeats per item and variant."),
    max_ranks: Optional[int] = typer.Option(None, "--max-ranks", help="Most ranks of a collective replay (default: this machine's CPUs or GPUs)."),
    together: int = typer.Option(1, "--together", help="Ops and chains: run each with N-1 neighbour processes doing the same on this CPU, as N ranks shared the host (default 1: alone)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the items and whether they can be rebuilt; run and store nothing."),
    as_json: bool = JsonOption,
) -> None:
    """Replay the run's top ops and collectives on this machine and verify fix variants."""
    if device is not None and device not in ("cpu", "cuda") and not device.startswith("cuda:"):
        from bprof.errors import UsageError
        raise UsageError(f"unknown device {device!r} (cpu, cuda or cuda:N)")
    options = ReplayOptions(run=run, top=top, op=op, collectives_only=collectives,
                            variants=tuple(variant) if variant else VARIANTS, device=device, repeats=repeats,
                            max_ranks=max_ranks, together=together, dry_run=dry_run)
    con = open_existing_store(db)
    try:
        with Console(stderr=True).status("replaying") as status:
            plan, results = run_replay(con, options, progress=lambda m: status.update(f"replaying: {m}"))
    finally:
        con.close()
    if as_json:
        print_json([r.record() for r in results])
        return
    table = Grid("item", "variant", "traced", "replayed", "spread", "speedup", "outcome", "verifies finding",
                  title=f"replay of run {plan.run_name}" + (" (dry run)" if dry_run else ""),
                  caption=f"intra-op threads {plan.intra_op_threads or 'unknown'}"
                  + (f"; ops and chains with {together - 1} neighbour process(es) running them" if together > 1 else "")
                  + "; times per call (loops: per loop, storms: per step)")
    for r in results:
        if r.status == "not_applicable" and r.variant != "baseline":
            continue  # in --json and the replays table; a table row per inapplicable variant hides the rest
        spread = "" if r.replayed_spread_frac is None else f"{100 * r.replayed_spread_frac:.0f}%"
        outcome = verdict_text(r.verdict, r.num_repeats) or r.classification or (f"{r.status}: {r.reason}" if r.reason else r.status)
        table.add_row(escape(r.item), r.variant, _t(r.traced_ns), _t(r.replayed_ns), spread,
                      "" if r.speedup is None else f"{r.speedup:.2f}x", escape(outcome),
                      escape(r.finding_title or "") if r.variant == "baseline" else "")
    table.print(Console())


def _t(ns):
    if ns is None:
        return ""
    return f"{ns / 1e6:.3f} ms" if ns >= 100_000 else f"{ns / 1e3:.1f} us"
