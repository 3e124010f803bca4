"""Compare: two runs side by side: headline, the split of the median rank, kernel classes, and the
findings that appeared or went away."""

from __future__ import annotations

import re

import duckdb

from bprof.dashboards import format as fmt
from bprof.dashboards.figures.style import PARTS
from bprof.dashboards.read import findings, has_table, is_analysed, metrics, rows, run_info
from bprof.dashboards.sections import Section, Table, Text, View

PATH = "/compare"
TITLE = "Compare"
CONTROLS = ("run", "base")
IN_HTML = False


def sections(con: duckdb.DuckDBPyConnection, view: View) -> list[Section]:
    if view.base_run_id is None or view.base_run_id == view.run_id:
        return [Text("no-base", "choose a second run to compare with (the 'compare with' control)")]
    a, b = view.base_run_id, view.run_id
    for run_id in (a, b):
        if not is_analysed(con, run_id):
            return [Text("not-analysed", f"run {run_id} is not analysed yet: run `bprof analyze {run_id}`", "warning")]
    names = [f"run {r} {run_info(con, r)['name']}" for r in (a, b)]
    ma, mb = metrics(con, a), metrics(con, b)
    head = Table("compare-headline", "Headline", ["", *names, "change"],
                 [[label, f(ma.get(k)) if ma.get(k) is not None else "", f(mb.get(k)) if mb.get(k) is not None else "",
                   _change(ma.get(k), mb.get(k))]
                  for k, label, f in (("step_time_ns", "step time", fmt.ms), ("mfu_frac", "MFU", fmt.pct),
                                      ("hfu_frac", "HFU", fmt.pct))])
    out: list[Section] = [head, _split(con, a, b, names), _classes(con, a, b, names)]
    fa, fb = ({_key(f): f for f in findings(con, r)} for r in (a, b))
    out.append(Table("compare-findings", "Findings that appeared or went away", ["", "finding", "lost/step"],
                     [["appeared", fb[k]["title"], fmt.ms(fb[k]["lost_ns"])] for k in fb if k not in fa]
                     + [["went away", fa[k]["title"], fmt.ms(fa[k]["lost_ns"])] for k in fa if k not in fb]))
    return out


def _split(con, a: int, b: int, names: list[str]) -> Table:
    medians = ", ".join(f"median({p}_ns) AS {p}" for p, _, _ in PARTS)
    by_run = {r["run_id"]: r for r in rows(con, f"""SELECT run_id, {medians} FROM breakdown_steps
                                                    WHERE run_id IN (?, ?) GROUP BY run_id""", [a, b])}
    return Table("compare-split", "Split of a step (median over ranks and steps)", ["part", *names, "change"],
                 [[label, fmt.ms(by_run.get(a, {}).get(p)), fmt.ms(by_run.get(b, {}).get(p)),
                   _change(by_run.get(a, {}).get(p), by_run.get(b, {}).get(p))] for p, label, _ in PARTS])


def _classes(con, a: int, b: int, names: list[str]) -> Table:
    if not has_table(con, "kernels_classes"):
        return Table("compare-classes", "Kernel time by class per step", ["class", *names, "change"], [])
    got = rows(con, """SELECT fine_class,
                              sum(dur_ns) FILTER (WHERE run_id = ?) / nullif(count(DISTINCT (rank, step)) FILTER (WHERE run_id = ?), 0) AS a_ns,
                              sum(dur_ns) FILTER (WHERE run_id = ?) / nullif(count(DISTINCT (rank, step)) FILTER (WHERE run_id = ?), 0) AS b_ns
                       FROM kernels_classes WHERE run_id IN (?, ?) GROUP BY fine_class
                       ORDER BY greatest(coalesce(a_ns, 0), coalesce(b_ns, 0)) DESC""", [a, a, b, b, a, b])
    return Table("compare-classes", "Kernel time by class per rank and step", ["class", *names, "change"],
                 [[c["fine_class"], fmt.ms(c["a_ns"]), fmt.ms(c["b_ns"]), _change(c["a_ns"], c["b_ns"])] for c in got])


def _change(old, new) -> str:
    if old is None or new is None or old == 0:
        return ""
    return f"{100 * (new - old) / abs(old):+.1f}%"


def _key(finding: dict) -> tuple[str, str]:
    """A finding's identity across runs: its analyzer and its title with the numbers taken out."""
    return finding["analyzer"], re.sub(r"[\d.,]+", "#", finding["title"])
