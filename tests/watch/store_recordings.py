"""Real watched recordings for the store, analyze, report and export tests: one 4-rank DDP job on
gloo whose rank 2 sleeps 30 ms a step from iteration 40 (injected by the program, not bprof), and
one clean job. Each is recorded once per test session (the first test module asking makes it) and
every module ingests it into its own store."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import ROOT, run_group, upstream_exit_abort

PROGRAM = ROOT / "tests" / "programs" / "ddp_mlp.py"
STEPS = 90  # the program's iterations: the watch has a row of each but the first (no step before it)
NUM_RANKS = 4
SLOW = ("--slow-rank", "2", "--slow-ms", "30", "--slow-from", "40")


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
