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


def test_a_detached_checkout_takes_its_branch_from_github_actions(tmp_path, monkeypatch):
    from bprof.profiler.launcher import _git_branch

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q", "-b", "main", str(tmp_path)], check=True)
    monkeypatch.chdir(tmp_path)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "x"], check=True)
    assert _git_branch() == "main"
    subprocess.run([*git, "checkout", "-q", "--detach"], check=True)
    monkeypatch.delenv("GITHUB_HEAD_REF", raising=False)
    monkeypatch.setenv("GITHUB_REF_NAME", "42/merge")
    assert _git_branch() == "42/merge"
    monkeypatch.setenv("GITHUB_HEAD_REF", "feature/x")  # a pull request: its source branch
    assert _git_branch() == "feature/x"
