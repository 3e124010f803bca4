"""Communication: by parallel dimension and process group, bandwidth vs message size, arrival skew."""

from __future__ import annotations

import duckdb

from bprof.dashboards import format as fmt
from bprof.dashboards.figures.comm import fig_busbw, fig_dims, fig_skew
from bprof.dashboards.read import has_table, rows
from bprof.dashboards.sections import Chart, Section, Table, View

PATH = "/comm"
TITLE = "Communication"
CONTROLS = ("run",)
IN_HTML = True
MAX_GROUP_ROWS = 50


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    out: list[Section] = [Chart("comm-dims", "By parallel dimension", fig_dims(con, view.run_id)),
                          Chart("comm-busbw", "Bandwidth", fig_busbw(con, view.run_id)),
                          Chart("comm-skew", "Arrival skew", fig_skew(con, view.run_id))]
    if has_table(con, "collperf_groups"):
        groups = rows(con, """
            SELECT g.*, b.dim FROM collperf_groups g
            LEFT JOIN breakdown_groups b ON b.run_id = g.run_id AND b.pg_name = g.pg_name
            WHERE g.run_id = ? ORDER BY g.wait_ns + g.transfer_ns DESC NULLS LAST LIMIT ?""", [view.run_id, MAX_GROUP_ROWS])
        out.append(Table("comm-groups", "Process groups, ops and message sizes (most time first)",
                         ["group", "ranks", "dim", "op", "size bucket", "calls", "median size", "median skew", "wait", "transfer",
                          "busbw", "of link peak"],
                         [[fmt.text(g["pg_desc"] or g["pg_name"]), _ranks(g["pg_ranks"]), fmt.text(g["dim"]), g["op"], fmt.size(g["size_bucket_bytes"]),
                           fmt.count(g["num_instances"]), fmt.size(g["median_bytes"]), fmt.ms(g["median_skew_ns"]),
                           fmt.ms(g["wait_ns"]), fmt.ms(g["transfer_ns"]), fmt.gbps(g["median_busbw_bytes_per_s"]),
                           fmt.pct(g["busbw_peak_frac"])] for g in groups],
                         note="wait: rank-time spent waiting for peers, summed over members and instances; transfer: summed over instances."))
    return out


def _ranks(ranks) -> str:
    """A group's ranks, short: '0, 2, 4, 6' or '0, 8, ... 1016 (128)'."""
    if not ranks:
        return ""
    if len(ranks) <= 8:
        return ", ".join(map(str, ranks))
    return f"{ranks[0]}, {ranks[1]}, ... {ranks[-1]} ({len(ranks)})"
