"""A real recorded store for the CLI's tests, built once per session: the run `make demo` records
(examples/train_gpt.py, TP=2 x DP=2 on 4 CPU ranks, gloo), calibrated at fp32 only and analysed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analyzers.recorded import TRAINER, record_script

ROOT = Path(__file__).resolve().parents[2]


def bprof_at(columns: int, *args, ok: bool = True) -> subprocess.CompletedProcess:
    """`bprof ARGS` in a terminal COLUMNS wide; asserted to succeed unless ok=False."""
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=600)
    if ok:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="session")
def demo_store(tmp_path_factory) -> Path:
    """The demo's run: train_gpt.py TP=2 x DP=2 on 4 CPU ranks, recorded, calibrated at fp32, analysed."""
    out = tmp_path_factory.mktemp("demo")
    db = record_script(out, "demo", TRAINER, ["--tp", "2", "--dp", "2", "--steps", "7"], nproc=4)
    bprof_at(200, "calibrate", "--db", db, "--dtype", "fp32", "--repeats", "3")
    bprof_at(200, "analyze", "--db", db)
    return db


