"""Run overview: the headline numbers `bprof analyze` prints, the split per rank, the findings
ranked by recoverable time with their evidence, and the replays that verified them."""

from __future__ import annotations

import json

import duckdb

from bprof.dashboards import format as fmt
from bprof.dashboards.figures.ranks import fig_split
from bprof.dashboards.read import findings, has_table, is_analysed, metrics, rows, run_info
from bprof.dashboards.figures.timeline import MAX_RANKS
from bprof.dashboards.sections import Chart, Link, Numbers, Section, Table, Text, View

PATH = "/overview"
TITLE = "Overview"
CONTROLS = ("run",)
IN_HTML = True

# (metric, label, format): the headline of `bprof analyze`, in its order.
HEADLINE = [("step_time_ns", "step time", fmt.ms), ("mfu_frac", "MFU", fmt.pct), ("hfu_frac", "HFU", fmt.pct),
            ("tokens_per_s_per_device", "tokens/s/device", lambda v: f"{v:,.0f}")]
MAX_EVIDENCE_CHARS = 400


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    run = run_info(con, view.run_id)
    out: list[Section] = [Numbers("run-facts", [
        ("run", "run", f"{run['run_id']} {run['name']}"),
        ("ranks", "ranks", f"{run['num_ranks_ingested']}/{run['world_size'] or '?'}"),
        ("device", "device", fmt.text(run["device_name"]) or "?"),
        ("started", "started", fmt.text(run["started_at"]))])]
    if run["missing_ranks"]:
        out.append(Text("partial", f"partial run: ranks {', '.join(map(str, run['missing_ranks']))} left no trace", "warning"))
    if not is_analysed(con, view.run_id):
        out.append(Text("not-analysed", f"run {run['run_id']} is not analysed yet: run `bprof analyze {run['run_id']}`", "warning"))
        return out
    m = metrics(con, view.run_id)
    items = [(name, label, "not measurable" if m[name] is None else f(m[name]))
             for name, label, f in HEADLINE if name in m]
    ranked = findings(con, view.run_id)
    if ranked:
        top = ranked[0]
        items.append(("top-finding", "top finding", f"{top['title']} ({fmt.ms(top['lost_ns']) or 'lost time not measurable'})"))
    out.append(Numbers("headline", items))
    out.append(Chart("split", "Where the step goes", fig_split(con, view.run_id)))
    out.append(Table("findings", "Findings, by time the step would get back",
                     ["lost/step", "severity", "analyzer", "finding", "advice", "evidence", "see"],
                     [[fmt.ms(f["lost_ns"]), f["severity"], f["analyzer"], f["title"], *_advice_evidence(f["evidence"]),
                       _evidence_link(view.run_id, f["evidence"])] for f in ranked],
                     note="lost/step: how much shorter the step would be with that cause removed; findings overlap and are never summed."))
    replays = _replays(con, view.run_id)
    if replays:
        out.append(replays)
    return out


def _advice_evidence(text) -> tuple[str, str]:
    evidence = json.loads(text) if text else {}
    advice = evidence.pop("advice", None) or ""
    shown = json.dumps(evidence, separators=(", ", ": "), default=str)
    return advice, shown if len(shown) <= MAX_EVIDENCE_CHARS else shown[:MAX_EVIDENCE_CHARS - 1] + "…"


def _evidence_link(run_id: int, text) -> Link | str:
    """The timeline of the finding's ranks (the first MAX_RANKS) in its first step, when it names ranks."""
    evidence = json.loads(text) if text else {}
    ranks = [r for r in evidence.get("ranks") or [] if isinstance(r, int)][:MAX_RANKS]
    if not ranks:
        return ""
    query = {"run": str(run_id), "ranks": ",".join(map(str, ranks))}
    steps = [s for s in evidence.get("steps") or [] if isinstance(s, int)]
    if steps:
        query["step"] = str(steps[0])
    return Link("timeline", "/timeline", query)


def _replays(con: duckdb.DuckDBPyConnection, run_id: int) -> Table | None:
    """The latest replay of each item and variant, next to the finding it verifies."""
    if not has_table(con, "replays"):
        return None
    found = rows(con, """
        SELECT finding_title, item_kind, item, variant, status, traced_ns, replayed_ns, speedup, verdict, classification, reason,
               coalesce(together, 1) AS together
        FROM replays WHERE run_id = ?
        QUALIFY row_number() OVER (PARTITION BY item_key, variant ORDER BY replayed_at DESC, replay_id DESC) = 1
        ORDER BY finding_title NULLS LAST, item, variant NULLS FIRST""", [run_id])
    if not found:
        return None
    return Table("replays", "Replays (bprof replay): each item rerun here, alone or beside neighbours running it "
                 "(--together), and fix variants",
                 ["finding", "kind", "item", "variant", "traced", "replayed", "processes", "speedup", "verdict",
                  "classification"],
                 [[fmt.text(r["finding_title"]), r["item_kind"], r["item"], fmt.text(r["variant"]) or "as traced",
                   fmt.ms(r["traced_ns"]), fmt.ms(r["replayed_ns"]) or fmt.text(r["reason"]), str(r["together"]),
                   "" if r["speedup"] is None else f"{r['speedup']:.2f}x", fmt.text(r["verdict"]),
                   fmt.text(r["classification"])] for r in found])
