"""A mistyped --db makes no store: every command that opens the store, other than ingest and
record (which create it) and calibrate, exits 2 with one line naming the path, and leaves nothing
behind.

calibrate creates the store too, on purpose: it measures the device, the one thing a user does on
a fresh machine before any run exists (then `bprof record` adds to that store), and there is no
other way to a store without a run. It creates it only with what it measured: a calibration that
fails leaves nothing behind, and a --db in a missing folder is refused before measuring.
"""

from __future__ import annotations

import json

import pytest

from bprof.store.db import open_store
from bprof.store.peaks import load_peaks
from tests.cli.test_analyze import bprof_synth
from tests.cli.test_cli import bprof

COMMANDS = [
    ["analyze"], ["whatif"], ["whatif", "-s", "no-host-gaps"], ["replay", "--dry-run"], ["runs"], ["info"],
    ["export", "--parquet", "{tmp}/parquet"], ["export", "--perfetto", "{tmp}/step.json"],
    ["report", "--html", "{tmp}/report.html"], ["report", "--serve", "--port", "8765"],
    ["ci", "record", "--branch", "main"], ["ci", "check"], ["ci", "trend"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_a_typo_in_db_exits_2_and_creates_nothing(command, tmp_path):
    typo = tmp_path / "typo.duckdb"
    args = [a.format(tmp=tmp_path) for a in command]
    done = bprof(*args, "--db", typo)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr.startswith("bprof: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert str(typo) in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []   # no store, no WAL, no output file


@pytest.mark.parametrize("args, exit_code", [(["--dtype", "tf32"], 2), (["--device", "cuda:99"], 4)],
                         ids=["tf32-on-cpu", "no-such-cuda-device"])
def test_a_calibration_that_fails_creates_no_store(args, exit_code, tmp_path):
    fresh = tmp_path / "fresh.duckdb"
    done = bprof("calibrate", "--db", fresh, *args)
    assert done.returncode == exit_code, (done.stdout, done.stderr)
    assert done.stderr.startswith("bprof: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_calibrate_refuses_a_missing_folder_before_measuring(tmp_path):
    typo = tmp_path / "no-such-dir" / "s.duckdb"
    done = bprof("calibrate", "--db", typo, "--dtype", "fp32", "--repeats", "1")
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert done.stderr == f"bprof: error: {typo}: cannot create a bprof store here ({typo.parent} is not a folder)\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_calibrate_on_a_fresh_machine_creates_the_store_that_record_and_ingest_then_add_to(tmp_path):
    fresh = tmp_path / "fresh.duckdb"
    done = bprof("calibrate", "--db", fresh, "--dtype", "fp32", "--repeats", "1", "--json")
    assert done.returncode == 0, done.stderr
    runs = bprof("runs", "--db", fresh, "--json")   # a store, with peaks and no run yet
    assert runs.returncode == 0, runs.stderr
    assert json.loads(runs.stdout) == []
    assert bprof_synth(tmp_path).returncode == 0
    done = bprof("ingest", tmp_path / "run", "--db", fresh, "--name", "after-calibrate")
    assert done.returncode == 0, done.stderr
    runs = bprof("runs", "--db", fresh, "--json")
    assert [r["name"] for r in json.loads(runs.stdout)] == ["after-calibrate"]
    con = open_store(fresh, read_only=True)
    try:
        assert [p.dtype for p in load_peaks(con)] == ["fp32"]   # the calibration is still there
    finally:
        con.close()
