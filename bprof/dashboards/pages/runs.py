"""Runs: every run in the store, and step time / MFU over runs."""

from __future__ import annotations

import duckdb

from bprof.dashboards import format as fmt
from bprof.dashboards.figures.runs import fig_ci_series, fig_history
from bprof.dashboards.read import rows
from bprof.dashboards.sections import Chart, Section, Table, View

PATH = "/"
TITLE = "Runs"
CONTROLS: tuple[str, ...] = ()
IN_HTML = False

MAX_COMMAND_CHARS = 120


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    runs = rows(con, """
        SELECT r.run_id, r.name, CAST(date_trunc('second', coalesce(r.started_at, r.ingested_at)) AS VARCHAR) AS started,
               r.command, r.world_size, r.num_ranks_ingested, r.device_name,
               max(m.value) FILTER (WHERE m.name = 'step_time_ns') AS step_time_ns,
               max(m.value) FILTER (WHERE m.name = 'mfu_frac') AS mfu_frac
        FROM runs r LEFT JOIN metrics m USING (run_id) GROUP BY ALL ORDER BY r.run_id DESC""")
    table = Table("runs-table", "Runs in this store (newest first)",
                  ["run", "name", "started", "command", "ranks", "device", "step time", "MFU"],
                  [[str(r["run_id"]), r["name"], fmt.text(r["started"]), _short(r["command"]),
                    f"{r['num_ranks_ingested']}/{r['world_size'] or '?'}", fmt.text(r["device_name"]),
                    fmt.ms(r["step_time_ns"]) or "not analysed", fmt.pct(r["mfu_frac"])] for r in runs])
    out: list[Section] = [table, Chart("runs-history", "History", fig_history(con))]
    if con.execute("SELECT count(*) FROM ci_runs").fetchone()[0]:
        out.append(Chart("runs-ci", "CI series", fig_ci_series(con)))
    return out


def _short(command) -> str:
    text = " ".join(command) if isinstance(command, list) else fmt.text(command)
    return text if len(text) <= MAX_COMMAND_CHARS else text[:MAX_COMMAND_CHARS - 1] + "…"
