"""`bprof hang PATH...`: which ranks stall a stuck job, from its Flight Recorder dumps."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bprof.cli.options import JsonOption, print_json
from bprof.errors import UsageError
from bprof.hang.dumps import JobDumps, load_job
from bprof.hang.verdict import Verdict, analyze


def register(app: typer.Typer) -> None:
    app.command("hang")(hang)


def hang(paths: list[Path] = typer.Argument(..., help="A `bprof record` run directory, or folders/files of "
                                                   "Flight Recorder dumps (pickle or JSON, one per rank)."),
         world_size: Optional[int] = typer.Option(None, "--world-size", min=1, help="Ranks in the job, when the "
                                                  "dumps cannot tell (gloo's carry no group members; the last rank's may be missing)."),
         db: Optional[Path] = typer.Option(None, "--db", help="Also store the verdict in this bprof store (the hangs "
                                           "table; created when missing), attached to the run of the same `bprof record` "
                                           "when one was ingested, else to a run row of the hang alone."),
         run: Optional[str] = typer.Option(None, "--run", help="With --db: the run (id or name) the verdict attaches to, "
                                           "e.g. a window ingested from the same job."),
         as_json: bool = JsonOption) -> None:
    """Name the ranks a hung job waits for: per process group who reached the stuck collective, who
    never did, who disagrees; then the root culprits with their reason and stack."""
    if run is not None and db is None:
        raise UsageError("--run says which run of the store the verdict attaches to: give --db too")
    job = load_job(paths, world_size)
    verdict = analyze(job)
    if db is not None:
        run_id, hang_id = store_verdict(db, verdict, job, paths, run)
        typer.echo(f"bprof: verdict stored as hang {hang_id} of run {run_id} in {db}", err=True)
    if as_json:
        print_json(verdict.to_json())
        return
    typer.echo(format_verdict(verdict))


def store_verdict(db: Path, verdict: Verdict, job: JobDumps, paths: list[Path], run: str | None = None) -> tuple[int, int]:
    """Store the verdict (bprof.hang.store) attached to `run`, else to the ingested run of the same
    `bprof record`, else to a run row of its own; with a window captured before the hang, first
    join the straggler analysis of that window (analysing the run when it is not analysed yet).
    Returns (run_id, hang_id)."""
    from bprof.hang.before import join, read_before
    from bprof.hang.store import record_run, save_hang
    from bprof.cli.options import open_existing_store
    from bprof.store.db import open_store
    from bprof.store.runs import resolve_run

    # a --run names a run of an existing store; without one the verdict makes its own run, like
    # ingest (only after the dumps were read: bad input creates no store)
    con = open_existing_store(db) if run is not None else open_store(db)
    try:
        run_id = resolve_run(con, run) if run is not None else record_run(con, paths)
        if run_id is not None:
            _analyse_if_needed(con, run_id)
            before = read_before(con, run_id)
            if before is not None:
                join(verdict, before)
        return save_hang(con, verdict, job, paths, run_id)
    finally:
        con.close()


def _analyse_if_needed(con, run_id: int) -> None:
    """`bprof analyze` of a run with ranks and no analysis yet (what `bprof analyze RUN` would do):
    the straggler analysis is the answer to "who was slow before"."""
    analysed = con.execute("SELECT count(*) FROM metrics WHERE run_id = ?", [run_id]).fetchone()[0]
    ranks = con.execute("SELECT num_ranks_ingested FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    if ranks and not analysed:
        from bprof.analyzers.run import analyze_run

        analyze_run(con, run_id)


def print_hang(run_dir: Path, hung: bool, db: Path | None = None) -> None:
    """After `bprof record --hang-timeout` ended a hung job (or saw ranks die): the verdict on stderr
    and in run/hang/verdict.json; with `db` (the record's store) also stored there."""
    import json

    job = load_job([run_dir])
    verdict = analyze(job)
    stored = None
    try:
        if db is not None:
            stored = store_verdict(db, verdict, job, [run_dir])
    finally:  # a store that cannot take it does not hide the verdict
        (run_dir / "hang" / "verdict.json").write_text(json.dumps(verdict.to_json(), indent=1))
        typer.echo(f"bprof: no rank completed an optimizer step for the hang timeout; dumps in {run_dir / 'hang'}"
                   if hung else f"bprof: ranks died; what the launcher saw is in {run_dir / 'hang'}", err=True)
        typer.echo(format_verdict(verdict), err=True)
    if stored:
        typer.echo(f"bprof: verdict stored as hang {stored[1]} of run {stored[0]} in {db}", err=True)


def format_verdict(v: Verdict) -> str:
    lines = [f"verdict: {v.verdict}"]
    for i, c in enumerate(v.culprits, 1):
        where = f"  group {c.process_group}  last seq {_n(c.last_seq)}" if c.process_group else ""
        lines.append(f"  {i}. rank {c.rank}  {c.reason}{where}")
        lines.append(f"     last collective: {c.last_collective}")
        if c.late_before is not None:
            lines.append(f"     late in the window before: {'yes' if c.late_before else 'no'}")
        for frame in c.stack[:5]:
            lines.append(f"     at {frame}")
    for m in v.mismatches[:10]:
        lines.append(f"  mismatch: rank {m['rank']} in group {m['process_group']} #{m['seq']}: "
                     f"{_sig(m['actual'])} where ranks {m['majority_ranks']} called {_sig(m['expected'])}")
    if not v.groups:
        lines += [f"note: {note}" for note in v.notes]
        return "\n".join(lines)
    lines.append("")
    header = ("group", "desc", "ranks", "stuck at", "op", "rank", "status", "enqueued", "started", "completed")
    rows = []
    for g in v.groups:
        for j, m in enumerate(g.members):
            rows.append((g.name if j == 0 else "", (g.desc or "") if j == 0 else "",
                         _ranks(g.ranks) if j == 0 else "",
                         (str(g.stuck_seq) if g.stuck_seq is not None else "-") if j == 0 else "",
                         (g.stuck_op or "-") if j == 0 else "", str(m.rank), m.status,
                         _n(m.last_enqueued), _n(m.last_started), _n(m.last_completed)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    for note in v.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def _sig(s: dict) -> str:
    sizes = ",".join("x".join(map(str, d)) for d in s["input_sizes"])
    return f"{s['op']}[{sizes}{' ' + s['dtypes'][0] if s['dtypes'] else ''}]"


def _ranks(ranks: list[int]) -> str:
    return ",".join(map(str, ranks)) if len(ranks) <= 8 else f"{ranks[0]}..{ranks[-1]} ({len(ranks)})"


def _n(v) -> str:
    return "-" if v is None else str(v)
