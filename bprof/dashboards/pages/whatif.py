"""What-if: the predictions `bprof whatif` stored for the run (whatif_runs, whatif): each scenario's
predicted step time and MFU against the measured run, and the unchanged replay per rank."""

from __future__ import annotations

import duckdb

from bprof.dashboards import format as fmt
from bprof.dashboards.figures.whatif import fig_whatif_ranks
from bprof.dashboards.read import has_table, rows
from bprof.dashboards.sections import Chart, Section, Table, Text, View

PATH = "/whatif"
TITLE = "What-if"
CONTROLS = ("run",)
IN_HTML = True


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    if not has_table(con, "whatif_runs"):
        return [Text("no-whatif", "no what-if predictions in this store: run `bprof whatif RUN --scenario ...`")]
    found = rows(con, """SELECT scenario, measured_step_ns, predicted_step_ns, delta_frac, measured_mfu_frac, predicted_mfu_frac,
                                max_error_frac, median_error_frac, assumptions
                         FROM whatif_runs WHERE run_id = ? ORDER BY scenario <> 'unchanged', predicted_step_ns""", [view.run_id])
    if not found:
        return [Text("no-whatif", f"no what-if predictions for run {view.run_id}: run `bprof whatif {view.run_id}` "
                                  "(with --scenario no-stragglers, no-host-gaps, perfect-overlap, scale:X=F, ...)")]
    table = Table("whatif-scenarios", "Scenarios: predicted step time and MFU (bprof whatif)",
                  ["scenario", "measured step", "predicted step", "change", "measured MFU", "predicted MFU",
                   "rank error (median / max)", "assumptions"],
                  [[w["scenario"], fmt.ms(w["measured_step_ns"]), fmt.ms(w["predicted_step_ns"]),
                    "" if w["delta_frac"] is None else f"{100 * w['delta_frac']:+.1f}%", fmt.pct(w["measured_mfu_frac"]),
                    fmt.pct(w["predicted_mfu_frac"]), f"{fmt.pct(w['median_error_frac'])} / {fmt.pct(w['max_error_frac'])}",
                    _assumptions(w["assumptions"])] for w in found],
                  note="unchanged: the replay of what was measured, a consistency check of the graph (its error, "
                       "not a measure of accuracy); the others: the step the scenario predicts.")
    return [table, Chart("whatif-ranks", "Per rank", fig_whatif_ranks(con, view.run_id))]


def _assumptions(value) -> str:
    if value is None:
        return ""
    return "; ".join(map(str, value)) if isinstance(value, list) else str(value)
