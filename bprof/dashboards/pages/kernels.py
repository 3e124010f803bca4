"""Kernels: time by class, the top kernels and ops, and the roofline."""

from __future__ import annotations

import duckdb

from bprof.dashboards import format as fmt
from bprof.dashboards.figures.kernels import fig_classes, fig_roofline
from bprof.dashboards.read import has_table, rows
from bprof.dashboards.sections import Chart, Section, Table, View

PATH = "/kernels"
TITLE = "Kernels"
CONTROLS = ("run",)
IN_HTML = True
MAX_TOP_ROWS = 30
# C++ template names of kernels run to hundreds of characters; the table shows their start
MAX_NAME_CHARS = 140


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    out: list[Section] = [Chart("kernel-classes", "Classes", fig_classes(con, view.run_id))]
    if has_table(con, "kernels_top"):
        top = rows(con, """SELECT name, kind, fine_class, num_calls, num_ranks, dur_ns, mean_dur_ns, share_frac
                           FROM kernels_top WHERE run_id = ? ORDER BY dur_ns DESC LIMIT ?""", [view.run_id, MAX_TOP_ROWS])
        out.append(Table("kernel-top", "Top kernels (device time, all ranks)",
                         ["name", "kind", "class", "calls", "ranks", "total", "mean", "share"],
                         [[_short(k["name"]), k["kind"], k["fine_class"], fmt.count(k["num_calls"]), fmt.count(k["num_ranks"]),
                           fmt.ms(k["dur_ns"]), fmt.ms(k["mean_dur_ns"]), fmt.pct(k["share_frac"])] for k in top]))
    out.append(Chart("kernel-roofline", "Roofline", fig_roofline(con, view.run_id)))
    return out


def _short(name: str) -> str:
    return name if len(name) <= MAX_NAME_CHARS else name[:MAX_NAME_CHARS - 1] + "…"
