"""`bprof ci` as CI runs it: a real subprocess over stores of inline analysed runs; exit codes 0, 1,
2 and 3 (inconclusive or no decision), one-line errors, --history, --json, --junit and
$GITHUB_STEP_SUMMARY."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from xml.etree import ElementTree as ET

import pytest

from bprof.ci.history import save
from bprof.ci.summary import summarize
from bprof.store.db import open_store
from bprof.store.runs import resolve_run
from tests.ci.samples import insert_run

# per-run step times (ns) of inline baseline runs: about 100 ms with a 1-2% spread between runs
BASE_STEP_NS = [100_000_000, 101_500_000, 99_000_000, 100_800_000, 98_700_000, 100_200_000]


def bprof(*args, env=None):
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **(env or {})})


def steps(run_ns: int, outlier_step: bool = False) -> list[list[int]]:
    """5 steps x 2 ranks around run_ns; with a checkpoint-like step 3 at 3x."""
    rows = [[run_ns + d, run_ns - 200_000 + d] for d in (0, 300_000, -250_000, 150_000, -100_000)]
    if outlier_step:
        rows[3] = [3 * run_ns, 3 * run_ns]
    return rows


@pytest.fixture
def stores(tmp_path):
    """--db with the baseline runs and candidates; the baseline runs recorded into --history."""
    db, history = tmp_path / "bprof.duckdb", tmp_path / "history.duckdb"
    con = open_store(db)
    for i, ns in enumerate(BASE_STEP_NS):
        insert_run(con, f"base{i}", steps(ns, outlier_step=i == 2))
    insert_run(con, "same", steps(100_300_000))
    insert_run(con, "slow", steps(130_000_000))
    insert_run(con, "newtorch", steps(100_000_000), torch_version="2.14.0")
    insert_run(con, "benchx", steps(100_000_000), benchmark="other")
    hist = open_store(history)
    for i in range(len(BASE_STEP_NS)):  # what `bprof ci record base<i> --branch main --history` does, in-process
        save(hist, summarize(con, resolve_run(con, f"base{i}")), "main", str(db))
    hist.close()
    con.close()
    return db, history


def test_record_says_what_it_added_and_which_steps_it_left_out(stores):
    db, history = stores
    again = bprof("ci", "record", "base2", "--branch", "main", "--db", db, "--history", history)
    assert again.returncode == 0
    assert again.stdout.strip() == (f"already in series 'main': run base2 (step time 98.95 ms over 5 steps, "
                                    f"outlier steps [3] excluded) into {history}")


def test_an_unchanged_run_passes_and_a_slower_one_fails_with_reports(stores, tmp_path):
    db, history = stores
    same = bprof("ci", "check", "same", "--db", db, "--history", history, "--metric", "step_time")
    assert same.returncode == 0, same.stderr
    assert "## bprof ci check: no regression" in same.stdout

    summary, junit = tmp_path / "summary.md", tmp_path / "junit.xml"
    slow = bprof("ci", "check", "slow", "--db", db, "--history", history, "--json", "--junit", junit,
                 env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert slow.returncode == 1, slow.stderr
    data = json.loads(slow.stdout)
    assert data["status"] == "regression"
    assert data["baseline"]["runs"] == [f"base{i}" for i in range(6)]
    step, mfu = data["metrics"]
    assert (step["metric"], step["verdict"], mfu["metric"], mfu["verdict"]) == ("step_time", "regression", "mfu", "regression")
    assert step["candidate"] == 130_000_000 + 0  # median of the slow rank of each step (the job's step)
    suite = ET.parse(junit).getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("2", "2")
    assert "## bprof ci check: regression" in summary.read_text()


def test_too_few_baseline_runs_exits_3_with_one_line(stores, tmp_path):
    db, history = stores
    junit = tmp_path / "j.xml"
    done = bprof("ci", "check", "same", "--db", db, "--history", history, "--baseline", "base3", "--junit", junit)
    assert done.returncode == 3
    assert done.stderr.splitlines() == ["bprof: error: not enough data: 4 baseline runs in series 'main' for benchmark "
                                        "'bench', need 5 (add runs with `bprof ci record RUN --branch main`)"]
    assert ET.parse(junit).getroot().get("errors") == "1"


def test_runs_that_are_not_comparable_exit_3_naming_the_difference(stores):
    db, history = stores
    done = bprof("ci", "check", "newtorch", "--db", db, "--history", history)
    assert done.returncode == 3
    [line] = done.stderr.splitlines()
    assert line.startswith("bprof: error: not comparable: run 'newtorch' differs from baseline run 'base5' of series "
                           "'main': torch_version 2.14.0 (candidate) vs 2.13.0 (baseline)")


def test_a_band_wider_than_the_limit_is_inconclusive_and_exits_3(stores, tmp_path):
    # the baseline runs spread about 1%: their 99% band reaches about +5%, over a 1% limit
    db, history = stores
    junit = tmp_path / "j.xml"
    done = bprof("ci", "check", "same", "--db", db, "--history", history, "--max-band-frac", "1%", "--json",
                 "--junit", junit)
    assert done.returncode == 3, done.stderr
    data = json.loads(done.stdout)
    assert data["status"] == "inconclusive" and data["options"]["max_band_frac"] == 0.01
    assert {m["metric"]: m["verdict"] for m in data["metrics"]} == {"step_time": "inconclusive", "mfu": "inconclusive"}
    # a 1% spread is too much for any number of runs to fit a 1% limit
    assert data["advice"][0].startswith("more baseline runs will not do it alone: ")
    assert data["advice"][1].startswith("a quieter runner")
    # the inline runs have no kernels or collectives: no work metrics, and the report says why
    assert data["metrics_left_out"][0].startswith("executed_flops: the candidate has none (no executed FLOPs")
    assert ET.parse(junit).getroot().get("errors") == "2"
    text = bprof("ci", "check", "same", "--db", db, "--history", history, "--max-band-frac", "0.01")
    assert text.returncode == 3 and text.stdout.startswith("## bprof ci check: inconclusive")


@pytest.mark.parametrize("flags, message", [
    (["--threshold", "abc"], "--threshold must be a fraction or a percentage"),
    (["--threshold", "150%"], "--threshold must be in [0%, 100%)"),
    (["--confidence", "1.5"], "--confidence must be in (0.5, 1)"),
    (["--metric", "loss"], "--metric must be one of step_time, mfu"),
    (["--baseline-runs", "3"], "--baseline-runs must be at least 5"),
    (["--max-band-frac", "0"], "--max-band-frac must be above 0"),
    (["--max-band-frac", "wide"], "--max-band-frac must be a fraction or a percentage"),
    (["--no-such-flag"], "No such option"),
])
def test_bad_flags_exit_2(stores, flags, message):
    db, history = stores
    done = bprof("ci", "check", "same", "--db", db, "--history", history, *flags)
    assert done.returncode == 2
    assert message in done.stderr


def test_unknown_run_and_missing_history_exit_2(stores, tmp_path):
    db, history = stores
    done = bprof("ci", "check", "nosuch", "--db", db, "--history", history)
    assert done.returncode == 2
    assert done.stderr.splitlines() == ["bprof: error: no run 'nosuch' in this store (see `bprof runs`)"]
    missing = bprof("ci", "check", "same", "--db", db, "--history", tmp_path / "none.duckdb")
    assert missing.returncode == 2 and "no history file here" in missing.stderr
    nobase = bprof("ci", "check", "same", "--db", db, "--history", history, "--baseline", "release")
    assert nobase.returncode == 2 and "no baseline series or run 'release'" in nobase.stderr
    other = bprof("ci", "check", "benchx", "--db", db, "--history", history)
    assert other.returncode == 3
    assert other.stderr.splitlines() == ["bprof: error: not enough data: 0 baseline runs in series 'main' for benchmark "
                                         "'other', need 5 (add runs with `bprof ci record RUN --branch main`)"]
    nodb = bprof("ci", "check", "--db", tmp_path / "none.duckdb")
    assert nodb.returncode == 2 and "none.duckdb: no bprof store here" in nodb.stderr
    assert not (tmp_path / "none.duckdb").exists()


def test_trend_names_the_run_where_the_step_time_shifted(tmp_path):
    db = tmp_path / "bprof.duckdb"
    con = open_store(db)
    run_ns = [100_000_000 + 700_000 * ((7 * i) % 5 - 2) for i in range(16)]
    run_ns[9:] = [int(v * 1.2) for v in run_ns[9:]]
    for i, ns in enumerate(run_ns):
        insert_run(con, f"r{i:02d}", steps(ns))
    for i in range(15):
        save(con, summarize(con, resolve_run(con, f"r{i:02d}")), "main", str(db))
    con.close()
    assert bprof("ci", "record", "r15", "--db", db).returncode == 0  # series: the run's branch (main)
    done = bprof("ci", "trend", "--db", db, "--json")
    assert done.returncode == 0, done.stderr
    [point] = json.loads(done.stdout)["change_points"]
    assert point["run_name"] == "r09" and point["change_frac"] == pytest.approx(0.2, abs=0.02)
    short = bprof("ci", "trend", "--db", db, "--branch", "nosuch")
    assert short.returncode == 2
