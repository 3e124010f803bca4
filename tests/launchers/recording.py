"""`bprof record -- <launcher> ...` for the launcher tests, and what every such recording must show."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import duckdb

from tests.conftest import run_group, upstream_exit_abort

ROOT = Path(__file__).resolve().parents[2]
WINDOW = "2:4"  # steps 2 and 3 of scripts that run 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def record(tmp_path: Path, launcher: list[str], *, timeout: float = 240, env: dict | None = None, options=()):
    """`bprof record --steps 2:4 [options] -- launcher...` from the repository root, ingested into tmp_path/s.duckdb."""
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(tmp_path / "run"), "--db",
           str(tmp_path / "s.duckdb"), "--steps", WINDOW, *options, "--", *launcher]
    for attempt in range(2):
        done = run_group(cmd, timeout=timeout, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        if attempt or not upstream_exit_abort(done):
            return done
        shutil.rmtree(tmp_path / "run", ignore_errors=True)  # a torch abort at exit (see conftest), not bprof
        (tmp_path / "s.duckdb").unlink(missing_ok=True)


def store(tmp_path: Path):
    return duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)


def rank_metas(tmp_path: Path) -> dict[int, dict]:
    return {int(p.name[4:-5]): json.loads(p.read_text()) for p in (tmp_path / "run" / "meta").glob("rank*.json")}


def assert_every_rank_recorded(tmp_path: Path, world_size: int) -> tuple[duckdb.DuckDBPyConnection, int]:
    """One metadata file and one trace per rank, steps 2 and 3 on each, no rank missing; the run id."""
    metas = rank_metas(tmp_path)
    assert sorted(metas) == list(range(world_size))
    for r, m in metas.items():
        assert (m["rank"], m["world_size"]) == (r, world_size)
        assert [w["window"] for w in m["windows_captured"]] == [WINDOW]
    traces = sorted(p.name for p in (tmp_path / "run" / "traces" / "iteration_2").glob("rank*.json.gz"))
    assert traces == [f"rank{r}.json.gz" for r in range(world_size)]
    con = store(tmp_path)
    run_id, missing = con.execute("SELECT run_id, missing_ranks FROM runs").fetchone()
    # a world of 1 has no process group, hence no Kineto distributedInfo, which is where ingest reads the
    # world size from: NULL (unknown) there, not [] (see the report of issue 26)
    assert missing == [] if world_size > 1 else missing in ([], None)
    steps = con.execute("SELECT rank, list(DISTINCT step ORDER BY step) FROM steps WHERE run_id = ? GROUP BY rank ORDER BY rank",
                        [run_id]).fetchall()
    assert steps == [(r, [2, 3]) for r in range(world_size)]
    return con, run_id


def assert_collectives_identified(con, run_id, world_size: int) -> set[str]:
    """Collectives on every rank, each with its group and sequence number, each instance complete; their ops."""
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM collectives WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()]
    assert ranks == list(range(world_size))
    assert con.execute("SELECT count(*) FROM collectives WHERE run_id = ? AND NOT is_p2p AND (seq IS NULL OR pg_name IS NULL)",
                       [run_id]).fetchone()[0] == 0
    incomplete = con.execute("""
        SELECT pg_name, seq FROM collectives WHERE run_id = ? AND NOT is_p2p GROUP BY pg_name, seq
        HAVING count(*) <> any_value(group_size) OR count(DISTINCT op) > 1 OR count(DISTINCT in_bytes) > 1""",
        [run_id]).fetchall()
    assert incomplete == []
    return {op for (op,) in con.execute("SELECT DISTINCT op FROM collectives WHERE run_id = ?", [run_id]).fetchall()}


def analyze(tmp_path: Path) -> dict:
    """`bprof analyze --json` of the recording: every rank has its step breakdown."""
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", "analyze", "--db", str(tmp_path / "s.duckdb"), "--json"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)
