"""Shared fixtures: where the real GPU traces live, and a fresh store per test."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_TRACES = ROOT.parent / "shared" / "traces"


def shared_trace(name: str) -> Path:
    """A folder of ../shared/traces; skips the test with the reason when it is absent."""
    path = SHARED_TRACES / name
    if not path.exists():
        pytest.skip(f"real trace fixtures not available: {path} is missing (../shared exists only in development checkouts)")
    return path


@pytest.fixture
def store(tmp_path):
    from bprof.store.db import open_store

    con = open_store(tmp_path / "bprof.duckdb")
    yield con
    con.close()


# torch 2.13 (CPU) sometimes aborts a process at interpreter exit after torch.profiler ran next
# to gloo threads: "terminate called without an active exception", after all its work is done.
# Seen once in 6 plain torchrun runs without bprof. Tests that launch such jobs rerun them once
# when exactly this abort is the reason for a failed exit, and only then.
UPSTREAM_EXIT_ABORT = "terminate called without an active exception"


def upstream_exit_abort(proc) -> bool:
    return proc.returncode != 0 and UPSTREAM_EXIT_ABORT in (proc.stderr or "")


def run_group(cmd, *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) in a session of its own, so that on a
    timeout the whole process tree - bprof record, torchrun and its ranks - is killed, not only the
    first process (a hung rank once stayed behind after its recording timed out)."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                          **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
