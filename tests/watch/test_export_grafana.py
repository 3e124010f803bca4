"""examples/grafana/bprof-watch.json: valid JSON whose every query names metrics (and labels) that
bprof.watch.metrics exposes, so the dashboard reads what bprof serves live and exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from bprof.watch.metrics import RankMetrics, Snapshot, families, text

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "bprof-watch.json"
METRIC = re.compile(r"\bbprof_[a-z_]+")
LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")
BY_LABELS = re.compile(r"\bby\s*\(([^)]*)\)")


def _full_snapshot() -> Snapshot:
    """Every field set, so every family (model FLOP/s included) has samples."""
    ranks = [RankMetrics(0, "a", [10_000_000, 12_000_000], 9e6, 1.0, 5, 6),
             RankMetrics(1, "b", [30_000_000, 31_000_000], 29e6, 3.1, 7, 8)]
    return Snapshot("job", 41, ranks, {(0, "0", "default_pg"): 1000, (1, "async", "Work.wait"): 2000}, 1,
                    model_flops_per_step=1e12, median_step_ns=2e7)


def _exposed() -> dict[str, set[str]]:
    """Sample name -> its label names, as a Prometheus server stores them."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text(_full_snapshot())):
        for sample in family.samples:
            out.setdefault(sample.name, set()).update(sample.labels)
    return out


def _queries(dash: dict) -> list[tuple[str, str]]:
    """(expr, legendFormat) of every panel target, annotation and templating query."""
    found = [(t["expr"], t.get("legendFormat", "")) for p in dash["panels"] for t in p["targets"]]
    found += [(a["expr"], a.get("titleFormat", "")) for a in dash["annotations"]["list"] if "expr" in a]
    found += [(v["definition"], "") for v in dash["templating"]["list"] if v["type"] == "query"]
    return found


def test_the_dashboard_is_json_with_the_panels_asked_for():
    dash = json.loads(DASHBOARD.read_text())
    titles = " | ".join(p["title"].lower() for p in dash["panels"])
    for wanted in ("step time p50 per rank", "straggler score per rank", "straggler score per host",
                   "blocked in collectives per process group", "windows triggered"):
        assert wanted in titles
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert all(p["targets"] for p in dash["panels"])


def test_every_metric_and_label_it_queries_is_exposed():
    exposed = _exposed()
    # the exposition is what metrics.families() makes: each family has a sample here
    assert {f.name for f in families(_full_snapshot())} <= {re.sub(r"_total$", "", n) for n in exposed}
    used = set()
    for expr, legend in _queries(json.loads(DASHBOARD.read_text())):
        names = METRIC.findall(expr)
        assert names, f"no bprof metric in {expr!r}"
        for name in names:
            assert name in exposed, f"{name} (in {expr!r}) is not a metric bprof exposes"
            used.add(name)
            labels = set(LEGEND_LABEL.findall(legend)) | set(re.findall(r"(\w+)\s*=~?", expr))
            for by in BY_LABELS.findall(expr):
                labels |= {b.strip() for b in by.split(",")}
            assert labels <= exposed[name] | {"le"}, f"{expr!r} uses labels {labels - exposed[name]} {name} lacks"
    # everything bprof exposes is on the dashboard (a new metric would be noticed here)
    assert {re.sub(r"_total$", "", n) for n in used} == {re.sub(r"_total$", "", n) for n in exposed}
