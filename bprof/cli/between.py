"""The "between windows" section of `bprof analyze`: a watched recording's per-rank series, its
episodes, and each triggered window's reason beside what that window's analysis found."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from bprof.cli.tables import Grid

MAX_RANK_ROWS = 16


def print_between(console: Console, data: dict) -> None:
    rec, job = data["recording"], data["job"]
    console.print(f"[bold]Between windows[/bold]: recording {rec['recording_id']} {escape(rec['name'])}, "
                  f"{rec['num_ranks']} ranks, {rec['num_iterations']} iterations; job step median "
                  f"{_ms(job['median_step_ns'])}, p90 {_ms(job['p90_step_ns'])}, worst {_ms(job['max_step_ns'])} "
                  f"over {job['num_iterations']} iterations without a trace window")
    ranks = Grid("rank", "host", "iterations", "median step", "p90 step", "own time", "score", "worst iterations",
                 title="Step time per rank between windows (own time: busy + waiting for data)")
    shown = sorted(data["ranks"], key=lambda r: -(r["median_own_ns"] or 0))[:MAX_RANK_ROWS]
    for r in sorted(shown, key=lambda r: r["rank"]):
        worst = ", ".join(f"{w['iteration']} ({_ms(w['step_ns'])})" for w in r["worst_iterations"] or [])
        ranks.add_row(str(r["rank"]), escape(r["host"] or ""), str(r["num_iterations"]), _ms(r["median_step_ns"]),
                      _ms(r["p90_step_ns"]), _ms(r["median_own_ns"]),
                      "" if r["score"] is None else f"{r['score']:.2f}x", worst)
    ranks.print(console)
    if len(data["ranks"]) > MAX_RANK_ROWS:
        console.print(f"({MAX_RANK_ROWS} ranks of most own time of {len(data['ranks'])} shown; --json has every rank)")
    if not data["episodes"]:
        console.print("When it went wrong: never; no rule of the live analysis held")
    else:
        episodes = Grid("rule", "rank", "iterations", "worst score", "window", title="When it went wrong")
        for e in data["episodes"]:
            episodes.add_row(e["rule"], "" if e["rank"] is None else str(e["rank"]),
                             f"{e['first_iteration']}-{e['last_iteration']}", f"{e['worst_score']:.2f}x",
                             "opened" if e["triggered"] else "none")
        episodes.print(console)
    for t in data["triggers"]:
        where = (f"run {t['run_id']} ({escape(t['run_name'])})" if t["run_id"] is not None
                 else "not captured or not ingested")
        console.print(f"[bold]window {t['start_iteration']}:{t['end_iteration']}[/bold] opened at iteration "
                      f"{t['seen_at_iteration']} by the {t['rule']} rule: {escape(t['reason'])}; {where}")
        if t["run_id"] is not None and not t["analysed"]:
            console.print(f"  not analysed yet: bprof analyze {t['run_id']}")
        for f in t["findings"]:
            lost = "" if f["lost_ns"] is None else f"{_ms(f['lost_ns'])}/step "
            console.print(f"  {lost}{f['severity']}: {escape(f['title'])}")
    if not data["triggers"]:
        console.print("Triggered windows: none")


def _ms(ns) -> str:
    return "" if ns is None else f"{ns / 1e6:.2f} ms"
