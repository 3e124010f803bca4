"""What `bprof ci check` and `bprof ci trend` hand to people and CI systems: a markdown summary, JUnit
XML (one test case per metric) and plain data for --json."""

from __future__ import annotations

from dataclasses import asdict
from xml.etree import ElementTree as ET

from bprof.ci.check import CheckResult, MetricVerdict
from bprof.ci.trend import ChangePoint

MAX_CAUSE_ROWS = 8


def fmt_value(value: float, unit: str) -> str:
    if unit == "ns":
        return f"{value / 1e6:.2f} ms"
    if unit == "frac":
        return f"{100 * value:.2f}%"
    if unit in ("flops", "bytes"):
        return f"{value:.4g} {'FLOP' if unit == 'flops' else 'B'}"
    return f"{value:.4g}"


def check_data(result: CheckResult) -> dict:
    """--json of a check (plain data)."""
    e = result.explanation
    return {
        "status": result.status,
        "candidate": {"run": result.candidate.run_name, "git_sha": result.candidate.git_sha,
                      "git_branch": result.candidate.git_branch, "benchmark": result.candidate.benchmark},
        "baseline": {"series": result.series, "runs": [b.run_name for b in result.baseline],
                     "git_shas": [b.git_sha for b in result.baseline],
                     "skipped_not_comparable": result.skipped_not_comparable},
        "unknown_facts": result.unknown_facts,
        "options": asdict(result.options),
        "metrics": [asdict(v) for v in result.verdicts],
        "metrics_left_out": result.metrics_left_out,
        "advice": result.advice,
        "explanation": None if e is None else {
            "headline": e.headline, "top_part": e.top_part, "critical_rank": e.critical_rank,
            "baseline_critical_rank": e.baseline_critical_rank,
            "parts": [asdict(c) for c in e.parts], "refinements": [asdict(c) for c in e.refinements],
            "work": [asdict(w) for w in e.work]},
    }


def check_markdown(result: CheckResult) -> str:
    c, o = result.candidate, result.options
    icon = {"regression": "❌", "improvement": "🚀", "inconclusive": "❔", "pass": "✅"}
    head = {"regression": "regression", "inconclusive": "inconclusive"}.get(result.status, "no regression")
    lines = [f"## bprof ci check: {head}", "",
             f"Candidate **{escape_md(c.run_name)}**{_commit(c.git_sha)} against the last {len(result.baseline)} runs of "
             f"series **{escape_md(result.series)}**{'' if not c.benchmark else f' (benchmark {escape_md(c.benchmark)})'}; "
             f"a regression must be outside the {o.confidence:.0%} prediction band of the baseline runs and "
             f"larger than {o.threshold_frac:.1%}; a band reaching further than ±{100 * o.max_band_frac:g}% "
             f"cannot pass a run.", "",
             "| metric | candidate | baseline | change | band | p | verdict |",
             "|---|---|---|---|---|---|---|"]
    for v in result.verdicts:
        lines.append(f"| {v.metric} | {fmt_value(v.candidate, v.unit)} | {fmt_value(v.baseline_center, v.unit)} | "
                     f"{v.change_frac:+.1%} | {fmt_value(v.band_low, v.unit)} – {fmt_value(v.band_high, v.unit)} | "
                     f"{v.p_value:.3g} | {icon[v.verdict]} {v.verdict}: {v.reason} |")
    lines.append("")
    if result.status == "inconclusive":
        lines += ["**Inconclusive**: the baseline is too noisy to pass this run. What would decide it:", ""]
        lines += [f"- {escape_md(a)}" for a in result.advice]
        lines.append("")
    for v in result.verdicts:
        if v.excluded_baseline_runs:
            runs = "; ".join(f"{escape_md(x.run_name)} ({fmt_value(x.value, v.unit)}: {x.reason})"
                             for x in v.excluded_baseline_runs)
            lines.append(f"Left out of the {v.metric} band as outlier baseline runs: {runs}.")
    if result.metrics_left_out:
        lines.append(f"Work metrics not compared: {'; '.join(map(escape_md, result.metrics_left_out))}.")
    steps = result.verdicts[0] if result.verdicts else None
    if steps is not None:
        excluded = (f"outlier steps excluded: {', '.join(map(str, steps.candidate_excluded_steps))}"
                    if steps.candidate_excluded_steps else "no outlier steps excluded")
        lines.append(f"Each run counts once: the median of its steps ({steps.candidate_num_steps} in the candidate, "
                     f"{excluded}).")
    if result.skipped_not_comparable:
        lines.append(f"Left out of the baseline as not comparable: {'; '.join(map(escape_md, result.skipped_not_comparable[-3:]))}.")
    if result.unknown_facts:
        lines.append(f"Not checked for comparability (unknown on one side): {', '.join(result.unknown_facts)}.")
    e = result.explanation
    if e is not None and e.parts:
        lines += ["", f"### Why: {escape_md(e.headline)}", "",
                  "| part of the step (critical rank) | baseline | candidate | change | |", "|---|---|---|---|---|"]
        parts = [r for r in e.parts if r.baseline_ns or r.candidate_ns]  # parts absent on both sides say nothing
        rows = parts[:MAX_CAUSE_ROWS] + [r for r in e.refinements if not r.within_noise][:MAX_CAUSE_ROWS]
        for r in rows:
            lines.append(f"| {escape_md(r.label())} | {r.baseline_ns / 1e6:.2f} ms | {r.candidate_ns / 1e6:.2f} ms | "
                         f"{r.delta_ns / 1e6:+.2f} ms | {'noise' if r.within_noise else ''} |")
    if e is not None and e.work:
        lines += ["", "| work per step (rank) | baseline | candidate | change |", "|---|---|---|---|"]
        for w in e.work[:MAX_CAUSE_ROWS]:
            change = f"{w.change_frac:+.1%}" if w.change_frac is not None else "new"
            lines.append(f"| {escape_md(w.label())} | {w.baseline:.4g} | {w.candidate:.4g} | {change} |")
    return "\n".join(lines) + "\n"


def check_junit(result: CheckResult | None, error: str | None = None) -> bytes:
    """JUnit XML: a test case per metric, failed on a regression, errored when inconclusive; one errored
    case when the check could not run."""
    suite = ET.Element("testsuite", name="bprof ci check")
    cases = []
    if result is None:
        case = ET.SubElement(suite, "testcase", classname="bprof.ci", name="check")
        ET.SubElement(case, "error", message=error or "check did not run").text = error
        cases.append(case)
    else:
        for v in result.verdicts:
            case = ET.SubElement(suite, "testcase", classname=f"bprof.ci.{result.series}", name=v.metric)
            text = (f"{v.metric}: {fmt_value(v.candidate, v.unit)} vs {fmt_value(v.baseline_center, v.unit)} "
                    f"({v.change_frac:+.1%}); {v.reason}")
            if v.verdict == "regression":
                why = result.explanation.headline if result.explanation else ""
                ET.SubElement(case, "failure", message=text).text = f"{text}\nwhy: {why}"
            elif v.verdict == "inconclusive":  # not decided: an error, as when the check could not run
                ET.SubElement(case, "error", message=text).text = "\n".join([text, *result.advice])
            else:
                ET.SubElement(case, "system-out").text = text
            cases.append(case)
    suite.set("tests", str(len(cases)))
    suite.set("failures", str(sum(1 for c in cases if c.find("failure") is not None)))
    suite.set("errors", str(sum(1 for c in cases if c.find("error") is not None)))
    return ET.tostring(suite, encoding="utf-8", xml_declaration=True)


def trend_markdown(metric: str, unit: str, rows: list[dict], points: list[ChangePoint], confidence: float) -> str:
    lines = [f"## bprof ci trend: {metric}", "",
             f"{len(rows)} runs; E-divisive change points significant at {confidence:.0%}:", ""]
    if not points:
        lines.append("no shift found.")
    for p in points:
        run = rows[p.index]
        lines.append(f"- at run **{escape_md(run['run_name'])}**{_commit(run['git_sha'])} (#{p.index + 1}): "
                     f"{fmt_value(p.before_median, unit)} → {fmt_value(p.after_median, unit)} "
                     f"({p.change_frac:+.1%}, p = {p.p_value:.3g})")
    return "\n".join(lines) + "\n"


def _commit(sha: str | None) -> str:
    return f" (commit {sha[:12]})" if sha else ""


def escape_md(text: str) -> str:
    """Run names and kernel names are untrusted: no table breaks or HTML in the summary."""
    return str(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def verdict_line(v: MetricVerdict) -> str:
    return f"{v.metric}: {v.verdict} ({v.change_frac:+.1%}; {v.reason})"
