"""Run overview: the run's hang verdict when it has one (bprof hang --db), the headline numbers
`bprof analyze` prints, the split per rank, the findings ranked by recoverable time with their
evidence, and the replays that verified them."""

from __future__ import annotations

import json

import duckdb

from bprof.dashboards import evidence, format as fmt
from bprof.dashboards.figures.ranks import fig_split
from bprof.dashboards.read import findings, has_table, is_analysed, metrics, rows, run_info
from bprof.dashboards.figures.timeline import MAX_RANKS
from bprof.dashboards.sections import Chart, Details, Link, Numbers, Section, Table, Text, View

PATH = "/overview"
TITLE = "Overview"
CONTROLS = ("run",)
IN_HTML = True

# (metric, label, format): the headline of `bprof analyze`, in its order.
HEADLINE = [("step_time_ns", "step time", fmt.ms), ("mfu_frac", "MFU", fmt.pct), ("hfu_frac", "HFU", fmt.pct),
            ("tokens_per_s_per_device", "tokens/s/device", lambda v: f"{v:,.0f}")]


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    run = run_info(con, view.run_id)
    out: list[Section] = [Numbers("run-facts", [
        ("run", "run", f"{run['run_id']} {run['name']}"),
        ("ranks", "ranks", f"{run['num_ranks_ingested']}/{run['world_size'] or '?'}"),
        ("device", "device", fmt.text(run["device_name"]) or "?"),
        ("started", "started", fmt.text(run["started_at"]))])]
    if run["missing_ranks"]:
        out.append(Text("partial", f"partial run: ranks {', '.join(map(str, run['missing_ranks']))} left no trace", "warning"))
    out += _hang(con, view.run_id)
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


def _advice_evidence(text) -> tuple[str, Details | str]:
    """The advice, and the evidence as readable text with its raw JSON on demand."""
    found = evidence.parse(text)
    advice = found.get("advice") or ""
    raw = evidence.raw(found)
    if raw == "{}":
        return advice, ""
    return advice, Details(evidence.summary(found) or "details", raw)


def _evidence_link(run_id: int, text) -> Link | str:
    """The timeline of the finding's ranks (the first MAX_RANKS) in its first step, when it names ranks."""
    found = evidence.parse(text)
    ranks = [r for r in found.get("ranks") or [] if isinstance(r, int)][:MAX_RANKS]
    if not ranks:
        return ""
    query = {"run": str(run_id), "ranks": ",".join(map(str, ranks))}
    steps = [s for s in found.get("steps") or [] if isinstance(s, int)]
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


def _hang(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Section]:
    """The run's latest stored hang verdict: the sentence, then one row per culprit."""
    if not has_table(con, "hangs"):
        return []
    found = rows(con, """SELECT verdict, culprits FROM hangs WHERE run_id = ?
                         ORDER BY analysed_at DESC, hang_id DESC LIMIT 1""", [run_id])
    if not found:
        return []
    culprits = json.loads(found[0]["culprits"])
    late = {True: "yes", False: "no", None: ""}
    return [Text("hang", f"hang: {found[0]['verdict']}", "warning"),
            Table("hang-culprits", "Hang: the ranks the others wait for (bprof hang)",
                  ["rank", "reason", "group", "last seq", "last collective", "late before", "top frame"],
                  [[str(c["rank"]), c["reason"], fmt.text(c["process_group"]),
                    "" if c["last_seq"] is None else str(c["last_seq"]), fmt.text(c.get("last_collective")),
                    late[c.get("late_before")], fmt.text((c.get("stack") or [""])[0])] for c in culprits],
                  note="late before: the straggler analysis of the step window captured before the hang flagged the rank.")]
