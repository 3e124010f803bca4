"""Real watched recordings for the store, analyze, report and export tests: one 4-rank DDP job on
gloo whose rank 2 sleeps 30 ms a step from iteration 40 (injected by the program, not bprof), and
one clean job. Each is recorded once per test session (the first test module asking makes it) and
every module ingests it into its own store."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, run_group, upstream_exit_abort

PROGRAM = ROOT / "tests" / "programs" / "ddp_mlp.py"
STEPS = 90  # the program's iterations: the watch has a row of each but the first (no step before it)
NUM_RANKS = 4
SLOW_RANK, SLOW_MS, SLOW_FROM = 2, 30, 40
SLOW = ("--slow-rank", str(SLOW_RANK), "--slow-ms", str(SLOW_MS), "--slow-from", str(SLOW_FROM))


def recording(tmp_path_factory: pytest.TempPathFactory, kind: str) -> Path:
    """The run directory of the `kind` ("slow" or "clean") recording, made on first use."""
    out = tmp_path_factory.getbasetemp() / f"watch-{kind}" / "rec"
    if (out / "watch" / "live.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--watch", "--steps", "1000:1003", "--no-ingest",
           "--out", str(out), "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={NUM_RANKS}", str(PROGRAM), "--steps", str(STEPS), *(SLOW if kind == "slow" else ())]
    for attempt in range(2):
        shutil.rmtree(out, ignore_errors=True)
        done = run_group(cmd, timeout=240, cwd=out.parent)
        if not (attempt == 0 and upstream_exit_abort(done)):
            break
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def parquet_rows(run_dir: Path, rank: int) -> dict:
    """A rank's steps rows read straight from its Parquet files (pyarrow, not bprof): the independent reader."""
    columns: dict[str, list] = {}
    for path in sorted((run_dir / "watch" / f"rank{rank}").glob("*.steps.parquet")):
        for name, values in pq.read_table(path).to_pydict().items():
            columns.setdefault(name, []).extend(values)
    return columns


def ingest_both(tmp_path_factory: pytest.TempPathFactory, folder: str) -> tuple[Path, Path, Path, dict]:
    """A new store under a fresh `folder` with both recordings ingested by `bprof ingest --json`:
    (db, slow run dir, clean run dir, {"slow": its JSON answer, "clean": ...})."""
    slow, clean = recording(tmp_path_factory, "slow"), recording(tmp_path_factory, "clean")
    db = tmp_path_factory.mktemp(folder) / "w.duckdb"
    answers = {}
    for kind, path in (("slow", slow), ("clean", clean)):
        done = subprocess.run([sys.executable, "-m", "bprof.cli.main", "ingest", str(path), "--db", str(db), "--json"],
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        answers[kind] = json.loads(done.stdout)
    return db, slow, clean, answers
