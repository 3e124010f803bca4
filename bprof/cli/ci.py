"""`bprof ci record | check | trend`: keep a baseline series of run summaries, gate a candidate run on
it (exit 0 pass, 1 regression, 2 usage, 3 inconclusive, not enough data or not comparable), find where a
series shifted."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List, Optional

import duckdb
import typer

from bprof.cli.options import DbOption, JsonOption, RunArgument, print_json
from bprof.errors import BprofError, UsageError
from bprof.store.db import open_store
from bprof.store.runs import resolve_run

ci_app = typer.Typer(help="CI gating: baseline history, regression check, trend.", no_args_is_help=True)
HistoryOption = typer.Option(None, "--history", help="A dedicated history file (a small DuckDB store of run summaries, "
                                                     "kept by CI as an artifact); default: the --db store itself.")


def register(app: typer.Typer) -> None:
    app.add_typer(ci_app, name="ci")


@contextmanager
def _stores(db: Path, history: Optional[Path], *, history_must_exist: bool) -> Iterator[tuple]:
    """(store connection, history connection); the same connection when there is no separate history.
    The store is opened for writing (a run not analysed yet is analysed first), but never created."""
    if not Path(db).exists():
        raise UsageError(f"{db}: no bprof store here (run `bprof record` or `bprof ingest` first, or pass --db)")
    con = open_store(db)
    try:
        if history is None or Path(history).resolve() == Path(db).resolve():
            yield con, con
            return
        if history_must_exist and not Path(history).exists():
            raise UsageError(f"{history}: no history file here (create it with `bprof ci record RUN --history {history}`)")
        hist = open_store(history)
        try:
            yield con, hist
        finally:
            hist.close()
    finally:
        con.close()


@contextmanager
def _history_only(db: Path, history: Optional[Path]) -> Iterator[duckdb.DuckDBPyConnection]:
    """The history to read: --history, else the --db store (read-only; neither is created)."""
    path = history if history is not None else db
    if not Path(path).exists():
        raise UsageError(f"{path}: no history here (add runs with `bprof ci record RUN --branch BRANCH`)")
    con = open_store(path, read_only=True)
    try:
        yield con
    finally:
        con.close()


def _summary(con: duckdb.DuckDBPyConnection, run: Optional[str]):
    """The run's CI summary; analyses the run first when it has not been analysed."""
    from bprof.analyzers.run import analyze_run
    from bprof.ci.summary import summarize

    run_id = resolve_run(con, run)
    if not con.execute("SELECT count(*) FROM step_metrics WHERE run_id = ?", [run_id]).fetchone()[0]:
        from rich.console import Console

        with Console(stderr=True).status(f"analysing run {run_id} first (bprof analyze)") as status:
            analyze_run(con, run_id, progress=lambda name: status.update(f"analysing run {run_id} first: {name}"))
    return summarize(con, run_id)


@ci_app.command("record")
def record(
    run: Optional[str] = RunArgument,
    branch: Optional[str] = typer.Option(None, "--branch", help="Baseline series to add the run to (default: the run's git branch)."),
    db: Path = DbOption,
    history: Optional[Path] = HistoryOption,
) -> None:
    """Add a run's summary to a baseline series (analysing the run first if needed)."""
    from bprof.ci.history import save

    with _stores(db, history, history_must_exist=False) as (con, hist):
        summary = _summary(con, run)
        series = branch or summary.git_branch
        if not series:
            raise UsageError(f"run {summary.run_name!r} has no recorded git branch: give the series with --branch")
        history_id, created = save(hist, summary, series, str(db))
    m = summary.metrics["step_time_ns"]
    excluded = f", outlier steps {m.excluded_steps} excluded" if m.excluded_steps else ""
    typer.echo(f"{'added' if created else 'already in'} series {series!r}: run {summary.run_name} "
               f"(step time {m.value / 1e6:.2f} ms over {m.num_steps} steps{excluded}) into {history or db}")


def _fraction(text: str, flag: str) -> float:
    """'3%' or '0.03' -> 0.03."""
    try:
        value = float(text[:-1]) / 100 if text.strip().endswith("%") else float(text)
    except ValueError:
        raise UsageError(f"{flag} must be a fraction or a percentage (0.03 or 3%), got {text!r}") from None
    return value


@ci_app.command("check")
def check(
    run: Optional[str] = RunArgument,
    db: Path = DbOption,
    history: Optional[Path] = HistoryOption,
    metric: Optional[List[str]] = typer.Option(None, "--metric", help="step_time, mfu, or a work metric: executed_flops, collective_calls, collective_bytes "
                                     "(amounts per step, immune to a noisy runner's load; repeatable; default: step_time, mfu and "
                                     "each work metric that the candidate and the baseline runs have)."),
    baseline: str = typer.Option("main", "--baseline", help="Baseline series (a branch), or a run of the history "
                                                             "(its series up to that run)."),
    baseline_runs: int = typer.Option(10, "--baseline-runs", help="Compare with the last N comparable runs of the series (at least 5)."),
    threshold: str = typer.Option("3%", "--threshold", help="Smallest change that counts (3% or 0.03)."),
    confidence: float = typer.Option(0.99, "--confidence", help="Confidence of the baseline's prediction band, in (0.5, 1)."),
    max_band: str = typer.Option("0.25", "--max-band-frac", help="A candidate inside a band reaching further than this "
                                                                "above its center is inconclusive (exit 3), never a pass "
                                                                "(0.25 or 25%)."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write JUnit XML here."),
    markdown: Optional[Path] = typer.Option(None, "--markdown", help="Also write the markdown summary here."),
    as_json: bool = JsonOption,
) -> None:
    """Is RUN a regression against the baseline series? Exit 0 pass, 1 regression, 2 usage, 3 inconclusive (the
    baseline too noisy to judge), not enough data or not comparable."""
    from bprof.ci import report
    from bprof.ci.check import MIN_BASELINE_RUNS, CheckOptions, check as run_check
    from bprof.ci.history import resolve_baseline
    from bprof.ci.summary import METRICS

    metrics = tuple(dict.fromkeys(metric)) if metric else None
    for m in metrics or ():
        if m not in METRICS:
            raise UsageError(f"--metric must be one of {', '.join(METRICS)}, got {m!r}")
    threshold_frac = _fraction(threshold, "--threshold")
    if not 0 <= threshold_frac < 1:
        raise UsageError(f"--threshold must be in [0%, 100%), got {threshold}")
    if not 0.5 < confidence < 1:
        raise UsageError(f"--confidence must be in (0.5, 1), got {confidence}")
    if baseline_runs < MIN_BASELINE_RUNS:
        raise UsageError(f"--baseline-runs must be at least {MIN_BASELINE_RUNS}, got {baseline_runs}")
    max_band_frac = _fraction(max_band, "--max-band-frac")
    if not max_band_frac > 0:
        raise UsageError(f"--max-band-frac must be above 0, got {max_band}")
    options = CheckOptions(metrics, threshold_frac, confidence, max_band_frac, num_baseline_runs=baseline_runs)
    try:
        with _stores(db, history, history_must_exist=True) as (con, hist):
            candidate = _summary(con, run)
            name, entries = resolve_baseline(hist, baseline, candidate.benchmark)
            result = run_check(candidate, entries, options, series_name=name)
    except BprofError as exc:
        if exc.exit_code == 3:  # CI still gets its report of why nothing was decided
            _write(junit, report.check_junit(None, str(exc)))
            _step_summary(f"## bprof ci check: no decision\n\n{report.escape_md(str(exc))}\n")
            if as_json:
                print_json({"status": "error", "reason": str(exc)})
        raise
    text = report.check_markdown(result)
    _write(junit, report.check_junit(result))
    _write(markdown, text.encode())
    _step_summary(text)
    if as_json:
        print_json(report.check_data(result))
    else:
        typer.echo(text)
    if result.status == "regression":
        raise typer.Exit(1)
    if result.status == "inconclusive":
        raise typer.Exit(3)


@ci_app.command("trend")
def trend(
    db: Path = DbOption,
    history: Optional[Path] = HistoryOption,
    branch: str = typer.Option("main", "--branch", help="Baseline series to scan."),
    benchmark: Optional[str] = typer.Option(None, "--benchmark", help="Benchmark name (default: the series' only one)."),
    metric: str = typer.Option("step_time", "--metric", help="step_time, mfu, executed_flops, collective_calls or collective_bytes."),
    confidence: float = typer.Option(0.99, "--confidence", help="Significance of a change point: 1 - p, in (0.5, 1)."),
    permutations: int = typer.Option(199, "--permutations", min=19, help="Random reorderings behind each p-value."),
    as_json: bool = JsonOption,
) -> None:
    """Find the runs (commits) where a metric of a baseline series shifted (E-divisive, permutation test)."""
    from bprof.ci import report
    from bprof.ci.history import load_series, series_names
    from bprof.ci.summary import METRICS
    from bprof.ci.trend import MIN_SEGMENT_RUNS, change_points
    from bprof.errors import DataError

    if metric not in METRICS:
        raise UsageError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if not 0.5 < confidence < 1:
        raise UsageError(f"--confidence must be in (0.5, 1), got {confidence}")
    store_name, unit, _ = METRICS[metric]
    with _history_only(db, history) as hist:
        if branch not in series_names(hist):
            raise UsageError(f"no series {branch!r} in the history (series: {', '.join(series_names(hist)) or 'none yet'})")
        if benchmark is None:
            names = [r[0] for r in hist.execute("SELECT DISTINCT benchmark FROM ci_runs WHERE series = ?", [branch]).fetchall()]
            if len(names) > 1:
                raise UsageError(f"series {branch!r} holds benchmarks {sorted(map(str, names))}: pick one with --benchmark")
            benchmark = names[0]
        entries = load_series(hist, branch, benchmark)
    rows = [{"run_name": e.summary.run_name, "git_sha": e.summary.git_sha,
             "value": (e.summary.metrics.get(store_name).value if e.summary.metrics.get(store_name) else None)}
            for e in entries]
    rows = [r for r in rows if r["value"] and r["value"] > 0]
    if len(rows) < 2 * MIN_SEGMENT_RUNS:
        raise DataError(f"not enough data: {len(rows)} runs of series {branch!r} measured {metric}, "
                        f"need {2 * MIN_SEGMENT_RUNS} to look for a shift")
    points = change_points([r["value"] for r in rows], confidence, permutations)
    if as_json:
        print_json({"metric": metric, "series": branch, "benchmark": benchmark, "runs": rows,
                    "change_points": [{**p.__dict__, "run_name": rows[p.index]["run_name"],
                                       "git_sha": rows[p.index]["git_sha"]} for p in points]})
        return
    text = report.trend_markdown(metric, unit, rows, points, confidence)
    _step_summary(text)
    typer.echo(text)


def _write(path: Optional[Path], data: bytes) -> None:
    if path is not None:
        Path(path).write_bytes(data)


def _step_summary(text: str) -> None:
    """GitHub Actions shows what a step appends to $GITHUB_STEP_SUMMARY on the run's page."""
    target = os.environ.get("GITHUB_STEP_SUMMARY")
    if target:
        with open(target, "a", encoding="utf-8") as f:
            f.write(text + "\n")
