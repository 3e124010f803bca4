"""bprof analyze's "between windows" view on real watched recordings: per-rank step statistics equal
to the same numbers computed from the Parquet files by hand, the episodes of live.json, and the
triggered window's reason next to that window run's own findings."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

import pytest

from bprof.watch.metrics import quantile
from tests.watch.store_recordings import NUM_RANKS, STEPS, ingest_both, parquet_rows

pytestmark = pytest.mark.slow


def bprof(*args):
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *map(str, args)], capture_output=True, text=True,
                          env={**__import__("os").environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return ingest_both(tmp_path_factory, "analyze")


@pytest.fixture(scope="module")
def window_analysis(store):
    db, slow, _, ingested = store
    [run] = ingested["slow"]["runs"]
    done = bprof("analyze", run["run_id"], "--db", db, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), run


def test_per_rank_statistics_are_those_of_the_rows_without_a_window(store, window_analysis):
    _, slow, _, _ = store
    data, _ = window_analysis
    view = data["between_windows"]
    assert [r["rank"] for r in view["ranks"]] == list(range(NUM_RANKS))
    for r in view["ranks"]:
        raw = parquet_rows(slow, r["rank"])
        rows = [(i, s, b + d) for i, s, b, d, w in zip(raw["iteration"], raw["step_ns"], raw["busy_ns"],
                                                        raw["data_idle_ns"], raw["windowed"]) if not w]
        steps = [s for _, s, _ in rows]
        assert r["num_iterations"] + r["num_windowed"] == STEPS - 1 and r["num_iterations"] == len(rows)
        assert r["median_step_ns"] == statistics.median(steps)
        assert r["p90_step_ns"] == pytest.approx(quantile(steps, 0.9), rel=1e-12)
        assert r["max_step_ns"] == max(steps)
        assert r["median_own_ns"] == statistics.median(o for _, _, o in rows)
        worst = sorted(rows, key=lambda x: (-x[1], x[0]))[:3]
        assert r["worst_iterations"] == [{"iteration": i, "step_ns": s} for i, s, _ in worst]
    # rank 2 sleeps 30 ms a step for half the job: the most own time of the four
    assert max(view["ranks"], key=lambda r: r["median_own_ns"])["rank"] == 2


def test_the_trigger_shows_its_reason_beside_the_window_runs_findings(store, window_analysis):
    _, slow, _, _ = store
    data, run = window_analysis
    view = data["between_windows"]
    live = json.loads((slow / "watch" / "live.json").read_text())
    [trigger] = view["triggers"]
    [asked] = live["triggers"]
    assert (trigger["rule"], trigger["rank"], trigger["reason"], trigger["start_iteration"]) == (
        "rank", 2, asked["reason"], asked["start"])
    assert (trigger["run_id"], trigger["run_name"], trigger["analysed"]) == (run["run_id"], run["name"], True)
    # the findings shown are that run's three first, as bprof analyze of the run ranks them
    assert [f["title"] for f in trigger["findings"]] == [f["title"] for f in data["findings"][:3]]
    assert [(e["rule"], e["rank"], e["first_iteration"], e["last_iteration"]) for e in view["episodes"]] == [
        (e["rule"], e["rank"], e["first_iteration"], e["last_iteration"]) for e in live["episodes"]]
    assert view["windows"] == [{"run_id": run["run_id"], "run_name": run["name"], "window_range": f"{asked['start']}:"
                                f"{asked['start'] + asked['steps']}", "start_iteration": asked["start"],
                                "end_iteration": asked["start"] + asked["steps"], "attempt": 0,
                                "trigger_reason": asked["reason"]}]


def test_the_text_view_says_when_it_went_wrong_and_why_the_window_opened(store, window_analysis):
    db, _, _, ingested = store
    [run] = ingested["slow"]["runs"]
    done = bprof("analyze", run["run_id"], "--db", db)
    assert done.returncode == 0, done.stderr
    trigger = window_analysis[0]["between_windows"]["triggers"][0]
    assert "Between windows" in done.stdout and "When it went wrong" in done.stdout
    assert (f"window {trigger['start_iteration']}:{trigger['end_iteration']} opened at iteration "
            f"{trigger['seen_at_iteration']} by the rank rule") in done.stdout


def test_a_clean_recording_is_analysed_by_its_name_without_a_run(store):
    db, _, clean_dir, ingested = store
    [watch] = ingested["clean"]["watch"]
    done = bprof("analyze", watch["name"], "--db", db, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["run"] is None
    view = data["between_windows"]
    live = json.loads((clean_dir / "watch" / "live.json").read_text())
    assert view["triggers"] == [] and len(view["episodes"]) == len(live["episodes"])
    assert [r["num_iterations"] + r["num_windowed"] for r in view["ranks"]] == [STEPS - 1] * NUM_RANKS
    text = bprof("analyze", watch["name"], "--db", db)
    assert text.returncode == 0 and "Triggered windows: none" in text.stdout


def test_an_unknown_name_is_a_usage_error(store):
    done = bprof("analyze", "watch-nope", "--db", store[0])
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert "no run 'watch-nope'" in line and "nor a watched recording" in line
