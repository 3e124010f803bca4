"""The report's pages, figures, HTML export and CLI, without a browser (tests/dashboards/
test_report_browser.py drives a real one)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import duckdb
import pytest

from bprof.dashboards import format as fmt
from bprof.dashboards.export_html import export_html
from bprof.dashboards.figures.ranks import fig_rank_heatmap, fig_split
from bprof.dashboards.figures.timeline import MAX_EVENTS_PER_RANK, fig_timeline
from bprof.dashboards.pages import PAGES, overview, page_for
from bprof.dashboards.pages.defaults import with_defaults
from bprof.dashboards.sections import Chart, Numbers, Table, View
from bprof.store.db import SCHEMA_VERSION, open_store
from tests.dashboards.conftest import FLEET_RANKS, ROOT


@pytest.fixture
def con(report_store):
    con = open_store(report_store["db"], read_only=True)
    yield con
    con.close()


def test_every_page_draws_both_runs(con, report_store):
    for run_id in (report_store["synthetic"], report_store["fleet"]):
        view = with_defaults(con, View(run_id, base_run_id=report_store["synthetic"] if run_id == report_store["fleet"] else None))
        for page in PAGES:
            sections = page.sections(con, view)
            assert sections, page.TITLE
            keys = [s.key for s in sections]
            assert len(keys) == len(set(keys)), page.TITLE
            for s in sections:
                if isinstance(s, Chart) and run_id == report_store["synthetic"]:
                    assert s.figure.data, f"{page.TITLE}: {s.key} drew nothing for run {run_id}"
                elif isinstance(s, Chart) and not s.figure.data:   # the fleet run has no kernels: say why
                    assert s.figure.layout.annotations[0].text, f"{page.TITLE}: {s.key} is blank without a reason"


def test_page_paths():
    assert page_for("/") is PAGES[0] and page_for("/overview/") is overview and page_for("/nope") is None


def test_overview_headline_is_the_metrics_and_the_top_finding(con, report_store):
    run_id = report_store["synthetic"]
    [numbers] = [s for s in overview.sections(con, View(run_id)) if isinstance(s, Numbers) and s.key == "headline"]
    shown = {key: text for key, _, text in numbers.items}
    step_ns, hfu = con.execute("""SELECT max(value) FILTER (WHERE name = 'step_time_ns'), max(value) FILTER (WHERE name = 'hfu_frac')
                                  FROM metrics WHERE run_id = ?""", [run_id]).fetchone()
    assert shown["step_time_ns"] == fmt.ms(step_ns) and shown["hfu_frac"] == fmt.pct(hfu)
    assert shown["mfu_frac"] == "not measurable"   # the synthetic run declares no model FLOPs
    title, lost = con.execute("""SELECT title, lost_ns FROM findings WHERE run_id = ?
                                 ORDER BY lost_ns DESC NULLS LAST, severity, finding_id LIMIT 1""", [run_id]).fetchone()
    assert shown["top-finding"] == f"{title} ({fmt.ms(lost)})"


def test_large_runs_stay_small(con, report_store):
    run_id = report_store["fleet"]
    heat = fig_rank_heatmap(con, run_id, "span_ns")
    assert len(heat.data[0].z) == FLEET_RANKS and len(set(heat.data[0].y)) == FLEET_RANKS
    split = fig_split(con, run_id)
    assert split.data[0].type == "heatmap" and len(split.data[0].z) == FLEET_RANKS
    # one value per rank and step: a 1,024-rank figure is tens of kB, not MB
    assert len(heat.to_json()) < 1_000_000


def test_timeline_keeps_the_longest_events_per_rank(con, report_store):
    run_id = report_store["synthetic"]
    view = with_defaults(con, View(run_id))
    fig = fig_timeline(con, run_id, view.step, [0, 1])
    lanes = {y for t in fig.data if t.type == "bar" for y in t.y}
    assert {lane.split()[0] for lane in lanes} == {"r0", "r1"}
    assert any(lane.endswith("collectives") for lane in lanes)
    bars = sum(len(t.x) for t in fig.data if t.type == "bar" and t.name != "collective")
    assert 0 < bars <= 2 * MAX_EVENTS_PER_RANK
    # the matched collectives of the two ranks are joined by lines
    [links] = [t for t in fig.data if t.name == "same collective"]
    assert sum(x is None for x in links.x) > 0


def test_html_export_escapes_trace_text(con, report_store, tmp_path):
    written = export_html(con, report_store["synthetic"], tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    assert written["pages"] == ["Overview", "Ranks", "Communication", "Kernels", "What-if"] and written["charts"] >= 8
    assert "window.__bprof_pwned" in text                      # the kernel is listed ...
    assert "<script>window.__bprof_pwned" not in text          # ... never as markup
    assert "&lt;script&gt;window.__bprof_pwned" in text
    assert "<script src=" not in text and '<link rel="stylesheet" href' not in text   # nothing fetched: works offline


def test_unanalysed_run_says_so(tmp_path):
    db = tmp_path / "s.duckdb"
    subprocess.run([sys.executable, "-m", "bprof.synth", str(tmp_path / "t"), "--dp", "2"], check=True,
                   capture_output=True, cwd=ROOT)
    subprocess.run([sys.executable, "-m", "bprof.cli.main", "ingest", str(tmp_path / "t"), "--db", str(db)],
                   check=True, capture_output=True, cwd=ROOT)
    con = open_store(db, read_only=True)
    texts = [s for s in overview.sections(con, View(1)) if s.key == "not-analysed"]
    assert texts and "bprof analyze 1" in texts[0].text
    for page in PAGES:   # no page fails on a run without analysis tables
        page.sections(con, with_defaults(con, View(1)))
    con.close()


def test_overview_shows_the_runs_hang_verdict(tmp_path):
    """A verdict stored by `bprof hang --db`: on the run it names (--run) and on a run of the hang alone,
    which every page draws without failing (it has no ranks)."""
    from tests.hang.test_store import _nccl_dumps

    db = tmp_path / "s.duckdb"
    subprocess.run([sys.executable, "-m", "bprof.synth", str(tmp_path / "t"), "--dp", "2", "--slow-rank", "1"],
                   check=True, capture_output=True, cwd=ROOT)
    assert _bprof("ingest", str(tmp_path / "t"), "--db", str(db)).returncode == 0
    for args in (["--run", "1"], []):
        done = _bprof("hang", str(_nccl_dumps(tmp_path / f"dumps{len(args)}")), "--db", str(db), *args)
        assert done.returncode == 0, done.stderr
    con = open_store(db, read_only=True)
    try:
        for run_id in (1, 2):
            sections = {s.key: s for s in overview.sections(con, View(run_id))}
            verdict = con.execute("SELECT verdict FROM hangs WHERE run_id = ?", [run_id]).fetchone()[0]
            assert sections["hang"].text == f"hang: {verdict}" and "rank 2 left no dump" in verdict
            # run 1 has a window (analysed on storing) with a planted straggler, rank 1; run 2 is the hang alone
            late = {1: "no", 2: ""}[run_id]
            assert sections["hang-culprits"].rows == [["2", "no_dump", "0", "1", "unknown (no dump)", late, ""]]
            assert ("captured before (run 1 \"t\", steps 5-7): rank 1 (not a culprit now" in verdict) == (run_id == 1)
            for page in PAGES:
                page.sections(con, with_defaults(con, View(run_id)))
    finally:
        con.close()


def _bprof(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *args], capture_output=True, text=True, cwd=cwd)


def test_cli_usage_errors(report_store, tmp_path):
    db = str(report_store["db"])
    for args, said in ((["report", "--db", db], "--serve, or --html FILE"),
                       (["report", "--db", db, "--serve", "--html", str(tmp_path / "x.html")], "--serve, or --html FILE"),
                       (["report", "nosuchrun", "--db", db, "--html", str(tmp_path / "x.html")], "no run 'nosuchrun'"),
                       (["report", "--db", db, "--html", str(tmp_path / "no" / "x.html")], "no such directory"),
                       (["report", "--db", str(tmp_path / "missing.duckdb"), "--serve"], "no bprof store here"),
                       (["report", "--db", db, "--serve", "--port", "70000"], "--port")):
        done = _bprof(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_cli_html_leaves_the_store_as_it_was(report_store, tmp_path):
    before = hashlib.sha256(report_store["db"].read_bytes()).hexdigest()
    done = _bprof("report", "synthetic-8", "--db", str(report_store["db"]), "--html", str(tmp_path / "r.html"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["bytes"] == (tmp_path / "r.html").stat().st_size
    assert hashlib.sha256(report_store["db"].read_bytes()).hexdigest() == before


def test_a_store_an_older_bprof_wrote_is_migrated_once_then_reported(tmp_path):
    """A schema-6 store (what the 6 -> 7 migration adds, taken away) is migrated as any writing
    command would, instead of refusing the read-only open, and the report reads it."""
    db = tmp_path / "s.duckdb"
    subprocess.run([sys.executable, "-m", "bprof.synth", str(tmp_path / "t"), "--dp", "2"], check=True,
                   capture_output=True, cwd=ROOT)
    assert _bprof("ingest", str(tmp_path / "t"), "--db", str(db)).returncode == 0
    con = duckdb.connect(str(db))
    con.execute("DROP TABLE exec_nodes; ALTER TABLE replays DROP COLUMN together; "
                "UPDATE meta SET value = '6' WHERE key = 'schema_version'")
    con.close()
    done = _bprof("report", "--db", str(db), "--html", str(tmp_path / "r.html"))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r.html").stat().st_size > 0
    con = open_store(db, read_only=True)
    try:
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
    finally:
        con.close()


def test_report_does_not_import_torch():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import bprof.dashboards.app, bprof.dashboards.export_html, bprof.cli.report\n")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


def test_runs_page_draws_the_ci_series_as_stored(tmp_path):
    """The values the gate compares, from summaries of real recordings (tests/ci/data)."""
    from bprof.ci.history import save
    from bprof.dashboards.pages import runs
    from tests.ci.samples import load

    con = open_store(tmp_path / "h.duckdb")
    summaries = list(load("ci_gate_run1").values())[:6]
    for s in summaries:
        save(con, s, "main", "bprof.duckdb")
    [chart] = [s for s in runs.sections(con, View(None)) if s.key == "runs-ci"]
    con.close()
    [steps] = [t for t in chart.figure.data if t.yaxis == "y"]
    assert list(steps.y) == pytest.approx([s.metrics["step_time_ns"].value / 1e6 for s in summaries])


def test_whatif_page_shows_the_stored_predictions(con, report_store):
    from bprof.dashboards.pages import whatif

    run_id = report_store["synthetic"]
    [table, chart] = whatif.sections(con, View(run_id))
    stored = con.execute("""SELECT scenario, predicted_step_ns, delta_frac FROM whatif_runs WHERE run_id = ?
                            ORDER BY scenario <> 'unchanged', predicted_step_ns""", [run_id]).fetchall()
    assert [r[0] for r in table.rows] == [s for s, _, _ in stored] and stored[0][0] == "unchanged"
    assert {"no-host-gaps", "scale:gemm=0.8"} <= {s for s, _, _ in stored}
    for row, (_, predicted, delta) in zip(table.rows, stored):
        assert row[2] == fmt.ms(predicted) and row[3] == f"{100 * delta:+.1f}%"
    # measured, then one line per stored scenario, one point per rank
    assert [t.name for t in chart.figure.data][0] == "measured" and len(chart.figure.data) == 1 + len(stored)
    assert all(len(t.x) == 8 for t in chart.figure.data)
    # the fleet run has none: the page says how to make them
    [text] = whatif.sections(con, View(report_store["fleet"]))
    assert "bprof whatif" in text.text


def test_the_download_trusts_only_three_integers_from_the_browser(report_store, tmp_path):
    """The download's spec travels through the browser: a forged one (a path for a name, SQL for a
    run) gets a one-line refusal, and the file name is always made by the server."""
    import requests

    from tests.dashboards.browser import serving

    planted = tmp_path / "pwned.json.gz"
    spec = {"kind": "perfetto", "filename": str(planted), "params": {"run": "1 OR 1=1", "step": 6, "ranks": [0]}}
    body = {"output": "..download.data...download-message.children..",
            "outputs": [{"id": "download", "property": "data"}, {"id": "download-message", "property": "children"}],
            "inputs": [{"id": "download-button", "property": "n_clicks", "value": 1}],
            "state": [{"id": "download-spec", "property": "data", "value": spec}],
            "changedPropIds": ["download-button.n_clicks"]}
    with serving(report_store["db"]) as url:
        refused = requests.post(url + "/_dash-update-component", json=body, timeout=60).json()["response"]
        spec["params"]["run"] = report_store["synthetic"]
        sent = requests.post(url + "/_dash-update-component", json=body, timeout=60).json()["response"]
    assert refused == {"download-message": {"children": "cannot export: not a run, step and ranks"}}
    assert sent["download"]["data"]["filename"] == f"bprof-run{report_store['synthetic']}-step6.json.gz"
    assert not planted.exists()
