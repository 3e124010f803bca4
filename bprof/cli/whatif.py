"""`bprof whatif [RUN] [--scenario S]...`: replay the run's steps unchanged (a consistency check)
and under each scenario; print the predicted step time and MFU against the measured run."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import numpy as np
import typer

from bprof.cli.options import DbOption, JsonOption, RunArgument, print_json, open_existing_store
from bprof.dashboards.format import pct
from bprof.store.runs import resolve_run

MAX_ROWS = 32  # rank-steps printed in full; above, a summary


def register(app: typer.Typer) -> None:
    app.command("whatif")(whatif)


def whatif(
    run: Optional[str] = RunArgument,
    scenario: Optional[List[str]] = typer.Option(
        None, "--scenario", "-s",
        help="A scenario, parts joined by '+' and applied in order: no-stragglers, no-host-gaps, perfect-overlap, "
             "scale:<kernel class or op>=<factor>, coll:bw=<GB/s>,lat=<us>[,algo=ring|tree], "
             "microbatches=<M> (a pipeline run with M micro-batches of the same size; applied after the other parts), "
             "dp=<N> (data-parallel groups of N ranks, weak scaling; alpha-beta link fitted from the run or a coll: part) "
             "(repeatable)."),
    db: Path = DbOption,
    as_json: bool = JsonOption,
) -> None:
    """Predict what a change buys by replaying each step's dependency graph."""
    from bprof.whatif.run import whatif as run_whatif

    texts = list(scenario or [])
    from bprof.whatif.scenarios import parse

    for t in texts:
        parse(t)  # usage errors before the store is opened
    con = open_existing_store(db)
    try:
        run_id = resolve_run(con, run)
        out = run_whatif(con, run_id, texts)
    finally:
        con.close()
    base = out.results[0]
    if as_json:
        rows = None
        if not texts:
            rows = [{"rank": int(r), "step": s, "predicted_ns": int(p), "measured_ns": int(m)}
                    for rr, s, pp, mm in zip(base.rank, base.step, base.predicted_ns, base.measured_ns)
                    for r, p, m in zip(rr.tolist(), pp.tolist(), mm.tolist())]
        print_json({"run": run_id, "scenarios": out.summaries, "rows": rows})
        return
    s0 = out.summaries[0]
    if not s0["num_steps"]:
        typer.echo(f"run {run_id}: no analysed step to replay")
        return
    if not texts:
        n = sum(len(r) for r in base.rank)
        if n <= MAX_ROWS:
            typer.echo(f"{'rank':>6} {'step':>6} {'predicted_ns':>15} {'measured_ns':>15} {'error':>9}")
            for rr, s, pp, mm in zip(base.rank, base.step, base.predicted_ns, base.measured_ns):
                for r, p, m in zip(rr.tolist(), pp.tolist(), mm.tolist()):
                    typer.echo(f"{r:>6} {s:>6} {p:>15,} {m:>15,} {abs(p - m) / max(m, 1):>9.4%}")
        else:
            err = np.concatenate([np.abs(p - m) / np.maximum(m, 1) for p, m in zip(base.predicted_ns, base.measured_ns)])
            typer.echo(f"{n:,} rank-steps ({s0['num_ranks']:,} ranks x {s0['num_steps']} steps) replayed: "
                       f"worst error {err.max():.4%}, median error {np.median(err):.4%}")
        typer.echo(f"job step: predicted {_ms(s0['predicted_step_ns'])} vs measured {_ms(s0['measured_step_ns'])} "
                   f"(unchanged replay; worst rank-step error {s0['max_error_frac']:.4%})")
        return
    typer.echo(f"run {run_id}: measured step {_ms(s0['measured_step_ns'])}, MFU {_pct(s0['measured_mfu_frac'])}; "
               f"unchanged replay within {s0['max_error_frac']:.4%} of every rank-step")
    typer.echo(f"{'scenario':<40} {'step':>12} {'delta':>9} {'MFU':>8}")
    for s in out.summaries[1:]:
        if s["withheld"]:
            typer.echo(f"{s['scenario']:<40} {'withheld':>12}")
            continue
        typer.echo(f"{s['scenario']:<40} {_ms(s['predicted_step_ns']):>12} {s['delta_frac']:>+9.2%} {_pct(s['predicted_mfu_frac']):>8}")
    for s in out.summaries[1:]:
        if s["withheld"]:
            typer.echo(f"{s['scenario']}: withheld: {s['withheld']}")
    typer.echo("assumptions:")
    for s in out.summaries[1:]:
        for a in s["assumptions"]:
            typer.echo(f"  - {a}")


def _ms(ns) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:,.2f} ms"


def _pct(frac) -> str:
    return "n/a" if frac is None else pct(frac, 2)
