"""Ranks: rank x step heatmaps grouped by host, the flagged stragglers, and the steps of one rank."""

from __future__ import annotations

import duckdb

from bprof.dashboards import format as fmt
from bprof.dashboards.figures.ranks import HEATMAPS, fig_rank_heatmap
from bprof.dashboards.read import has_table, rows
from bprof.dashboards.sections import Chart, Section, Table, Text, View

PATH = "/ranks"
TITLE = "Ranks"
CONTROLS = ("run", "ranks")
IN_HTML = True


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    if not has_table(con, "breakdown_steps"):
        return [Text("not-analysed", "not analysed: run `bprof analyze` first", "warning")]
    out: list[Section] = [Chart(f"heatmap-{column}", label, fig_rank_heatmap(con, view.run_id, column))
                          for column, label in HEATMAPS.items()]
    if has_table(con, "stragglers_ranks"):
        flagged = rows(con, """SELECT rank, host, lost_ns, cause, last_frac, imposed_wait_ns, score FROM stragglers_ranks
                               WHERE run_id = ? AND flagged ORDER BY lost_ns DESC""", [view.run_id])
        out.append(Table("stragglers", "Stragglers (flagged ranks)",
                         ["rank", "host", "lost/step", "cause", "arrives last", "wait it imposes", "score"],
                         [[str(r["rank"]), fmt.text(r["host"]), fmt.ms(r["lost_ns"]), fmt.text(r["cause"]),
                           fmt.pct(r["last_frac"]), fmt.ms(r["imposed_wait_ns"]),
                           "" if r["score"] is None else f"{r['score']:.2f}"] for r in flagged],
                         note=None if flagged else "no rank is flagged as a straggler"))
    if view.ranks:
        rank = view.ranks[0]
        per_step = rows(con, """SELECT step, span_ns, compute_ns, exposed_comm_ns, exposed_wait_ns, overlapped_comm_ns, idle_ns
                                FROM breakdown_steps WHERE run_id = ? AND rank = ? ORDER BY step""", [view.run_id, rank])
        out.append(Table("rank-steps", f"Steps of rank {rank}",
                         ["step", "step time", "compute", "exposed comm", "of which waiting", "overlapped comm", "idle"],
                         [[str(s["step"]), *(fmt.ms(s[k]) for k in ("span_ns", "compute_ns", "exposed_comm_ns",
                                                                   "exposed_wait_ns", "overlapped_comm_ns", "idle_ns"))]
                          for s in per_step]))
    return out
