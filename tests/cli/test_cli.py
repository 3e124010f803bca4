"""The bprof command as users run it: a real subprocess, exit codes, one-line errors, --json."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import shared_trace
from tests.store.tiny_traces import modern_trace, write


def bprof(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


def test_info_json_lists_all_reduce_with_bytes_and_group_ranks(tmp_path):
    db = tmp_path / "s.duckdb"
    done = bprof("ingest", shared_trace("a100_ddp_nccl_rank0"), "--db", db)
    assert done.returncode == 0, done.stderr
    assert "ingested run 1 (a100_ddp_nccl_rank0): 1 ranks, 40,573 events" in done.stdout
    info = bprof("info", "--db", db, "--json")
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    all_reduce = [c for c in data["collectives"] if c["op"] == "all_reduce"]
    assert len(all_reduce) == 15
    assert all(c["in_bytes"] > 0 and c["pg_ranks"] == [0, 1] for c in all_reduce)
    assert {c["in_bytes"] for c in all_reduce} == {8196000, 31502336, 26255360, 26550272, 9724160}
    assert data["ranks"][0]["device_name"] == "NVIDIA A100-PG509-200"
    assert data["ranks"][0]["steps"] == [4, 5, 6]
    assert data["events_by_kind"]["kernel"] == 2700


def test_runs_json_and_run_by_name(tmp_path):
    db = tmp_path / "s.duckdb"
    for rank in range(2):
        write(tmp_path / "job" / f"rank{rank}.json.gz", modern_trace(rank))
    assert bprof("ingest", tmp_path / "job", "--db", db, "--name", "baseline").returncode == 0
    runs = json.loads(bprof("runs", "--db", db, "--json").stdout)
    assert [(r["id"], r["name"], r["num_ranks_ingested"]) for r in runs] == [(1, "baseline", 2)]
    assert json.loads(bprof("info", "baseline", "--db", db, "--json").stdout)["id"] == 1
    again = bprof("ingest", tmp_path / "job", "--db", db)
    assert again.returncode == 0 and "already ingested as run 1 (baseline)" in again.stdout


def test_exit_codes_and_one_line_errors(tmp_path):
    db = tmp_path / "s.duckdb"
    missing = bprof("ingest", tmp_path / "nope", "--db", db)
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"bprof: error: {tmp_path / 'nope'}: no such file or directory"
    (tmp_path / "bad").mkdir()
    text = '{"traceEvents": [{"ph": "X", "name": bad}]}'
    (tmp_path / "bad" / "rank0.json").write_text(text)
    bad = bprof("ingest", tmp_path / "bad", "--db", db)
    assert bad.returncode == 3
    assert len(bad.stderr.splitlines()) == 1
    assert bad.stderr.startswith(f"bprof: error: {tmp_path / 'bad' / 'rank0.json'}: invalid JSON at byte {text.index('bad')} ")
    assert bprof("info", "7", "--db", db).returncode == 2
    assert bprof("info", "--db", tmp_path / "none.duckdb").returncode == 2
    assert bprof("ingest", "--no-such-flag", "x").returncode == 2
    debug = bprof("--debug", "ingest", tmp_path / "bad", "--db", db)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_export_parquet_is_hive_partitioned(tmp_path):
    import duckdb

    db = tmp_path / "s.duckdb"
    for rank in range(2):
        write(tmp_path / "job" / f"rank{rank}.json.gz", modern_trace(rank))
    assert bprof("ingest", tmp_path / "job", "--db", db).returncode == 0
    out = tmp_path / "pq"
    done = bprof("export", "--parquet", out, "--db", db)
    assert done.returncode == 0, done.stderr
    rows = duckdb.sql(f"SELECT run, rank, count(*) FROM read_parquet('{out}/events/**/*.parquet', "
                      "hive_partitioning = true) GROUP BY ALL ORDER BY ALL").fetchall()
    assert rows == [(1, 0, 9), (1, 1, 9)]
    assert bprof("export", "--parquet", out, "--db", db).returncode == 2  # never overwrites
    assert bprof("export", "--db", db).returncode == 2
