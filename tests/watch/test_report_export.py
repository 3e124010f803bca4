"""The ways out of a watched recording once it is in the store, on the real recordings of
tests/watch/store_recordings.py: `bprof export --prometheus` (parsed by prometheus_client's own text
parser, each value checked against the store or the Parquet files read by pyarrow), the report's
"Between windows" page (served sections and the static HTML export)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bprof.dashboards.export_html import export_html
from bprof.dashboards.pages import in_html, watch
from bprof.dashboards.pages.defaults import with_defaults
from bprof.dashboards.sections import Chart, Table, View
from bprof.store.db import open_store
from tests.watch.store_recordings import NUM_RANKS, ingest_both, parquet_rows

pytestmark = pytest.mark.slow


def bprof(*args):
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """(db, slow run dir, clean run dir, the slow recording's window run id, the clean recording's name)."""
    db, slow, clean, ingested = ingest_both(tmp_path_factory, "export")
    [window_run] = [r["run_id"] for r in ingested["slow"]["runs"]]
    [clean_watch] = ingested["clean"]["watch"]
    return db, slow, clean, window_run, clean_watch["name"]


def samples(path) -> dict[str, list]:
    """metric sample name -> [(labels, value)], read with prometheus_client's parser."""
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_the_prometheus_export_of_a_window_run_holds_what_the_store_and_the_rank_files_say(store, tmp_path):
    db, slow, _, window_run, _ = store
    out = tmp_path / "slow.prom"
    done = bprof("export", window_run, "--db", db, "--prometheus", out, "--json")
    assert done.returncode == 0, done.stderr
    written = json.loads(done.stdout)
    got = samples(out)
    assert written["samples"] == sum(map(len, got.values()))
    # data wait and GC pauses: every row of the rank, summed from its Parquet files
    for rank in range(NUM_RANKS):
        raw = parquet_rows(slow, rank)
        [(labels, data_s)] = [(lab, v) for lab, v in got["bprof_data_wait_seconds_total"] if lab["rank"] == str(rank)]
        assert data_s == pytest.approx(sum(raw["data_wait_ns"]) / 1e9, abs=1e-9)
        [gc_s] = [v for lab, v in got["bprof_gc_seconds_total"] if lab["rank"] == str(rank)]
        assert gc_s == pytest.approx(sum(raw["gc_ns"]) / 1e9, abs=1e-9)
        # the median of the rank's last 200 steps (all of them here: fewer than 200)
        [median_s] = [v for lab, v in got["bprof_rank_step_seconds"]
                      if lab["rank"] == str(rank) and lab["quantile"] == "0.5"]
        assert median_s == pytest.approx(statistics.median(raw["step_ns"]) / 1e9, rel=1e-6)
    con = open_store(db, read_only=True)
    try:
        rid = con.execute("SELECT recording_id FROM watch_recordings WHERE source_path = ?", [str(slow)]).fetchone()[0]
        triggers = con.execute("SELECT count(*) FROM watch_triggers WHERE recording_id = ?", [rid]).fetchone()[0]
        blocked = dict(((str(r), g), ns / 1e9) for r, g, ns in con.execute(
            "SELECT rank, pg_name, sum(blocked_ns) FROM watch_groups WHERE recording_id = ? GROUP BY ALL", [rid]).fetchall())
        scores = dict(con.execute("SELECT rank, score FROM watch_scores WHERE recording_id = ?", [rid]).fetchall())
    finally:
        con.close()
    assert triggers >= 1 and [v for _, v in got["bprof_windows_triggered_total"]] == [triggers]
    # DDP's bucket all-reduces come from its C++ reducer, not from Python: none here (watch_groups is empty)
    exported = {(lab["rank"], lab["group"]): v for lab, v in got.get("bprof_collective_blocked_seconds_total", [])}
    assert exported.keys() == blocked.keys() and all(exported[k] == pytest.approx(v, abs=1e-9) for k, v in blocked.items())
    exported_scores = {int(lab["rank"]): v for lab, v in got["bprof_straggler_score"]}
    assert exported_scores == pytest.approx({r: s for r, s in scores.items() if s is not None})
    # the slow rank (2) has the highest score, as live named it
    assert max(exported_scores, key=exported_scores.get) == 2


def test_a_clean_recording_exports_by_its_name_and_an_unknown_name_is_a_usage_error(store, tmp_path):
    db, _, _, _, clean_name = store
    out = tmp_path / "clean.prom"
    done = bprof("export", clean_name, "--db", db, "--prometheus", out)
    assert done.returncode == 0, done.stderr
    got = samples(out)
    assert [v for _, v in got["bprof_windows_triggered_total"]] == [0]
    assert {lab["rank"] for lab, _ in got["bprof_gc_seconds_total"]} == {str(r) for r in range(NUM_RANKS)}
    done = bprof("export", "no-such-run", "--db", db, "--prometheus", tmp_path / "x.prom")
    assert done.returncode == 2 and "no-such-run" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "x.prom").exists()


def test_the_between_windows_page_draws_every_rank_and_names_the_window_it_opened(store):
    db, slow, _, window_run, _ = store
    con = open_store(db, read_only=True)
    try:
        sections = {s.key: s for s in watch.sections(con, with_defaults(con, View(window_run)))}
    finally:
        con.close()
    for metric in ("own", "step"):
        chart = sections[f"watch-heatmap-{metric}"]
        assert isinstance(chart, Chart)
        [heatmap] = chart.figure.data
        assert len(heatmap.y) == NUM_RANKS
    triggers = sections["watch-triggers"]
    assert isinstance(triggers, Table) and triggers.rows
    [asked] = json.loads((slow / "watch" / "live.json").read_text())["triggers"]
    [(window, _, rule, reason, run, _)] = triggers.rows
    assert (window, rule, reason) == (f"{asked['start']}:{asked['start'] + asked['steps']}", "rank", asked["reason"])
    assert run.startswith(f"{window_run} ")


def test_the_static_report_has_the_page_for_a_window_run_only(store, tmp_path):
    db, _, _, window_run, _ = store
    con = open_store(db, read_only=True)
    try:
        assert in_html(watch, con, window_run)
        written = export_html(con, window_run, tmp_path / "r.html")
        page = (tmp_path / "r.html").read_text()
    finally:
        con.close()
    assert "Between windows" in written["pages"] and 'id="watch-heatmap-step"' in page and 'id="watch-triggers"' in page
    # a run without a watch has no such page: tests/dashboards/test_report.py lists that export's pages
