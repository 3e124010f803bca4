"""Runs carry the CI history's labels: benchmark, tags, branch and commit given to ingest."""

from __future__ import annotations

import subprocess
import sys

from bprof.store.db import open_store
from tests.store.tiny_traces import modern_trace, write


def test_ingest_labels_the_run(tmp_path):
    for rank in range(2):
        write(tmp_path / "job" / f"rank{rank}.json.gz", modern_trace(rank))
    db = tmp_path / "s.duckdb"
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", "ingest", str(tmp_path / "job"), "--db", str(db),
                           "--benchmark", "gpt-tiny", "--tag", "nightly", "--tag", "cpu", "--branch", "feature/x",
                           "--commit", "0123abcd"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    con = open_store(db, read_only=True)
    try:
        assert con.execute("SELECT benchmark, tags, git_branch, git_sha FROM runs").fetchall() == [
            ("gpt-tiny", ["nightly", "cpu"], "feature/x", "0123abcd")]
    finally:
        con.close()
