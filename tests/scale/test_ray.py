"""`--engine ray`: a local Ray cluster (2 CPUs, one per module) reduces a synthetic 4-rank run, one
task per rank trace, and the run ingested from its outputs analyses exactly as from its full
traces, with the same Parquet bytes as the local engine writes; a truncated trace fails alone,
named, the rest is ingested, and the rerun reduces only that trace and completes the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'bprof[ray]')")

from bprof.scale.fanout import FanoutOptions, ingest_fanout, reduce_paths  # noqa: E402
from tests.scale.runs import NUM_RANKS, analysed, full_reference, parquet_digests, write_synthetic_run  # noqa: E402
from tests.store.test_reduce import assert_same_cross_rank_results  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    """A Ray of 2 CPUs on this machine for the module (Ray puts the host's own address where
    127.0.0.1 is asked for: services.resolve_ip_for_localhost); shut down, its processes with it."""
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale-ray")
    run = write_synthetic_run(out / "run")
    full, _ = full_reference(run, out / "full.duckdb")
    yield out, run, full
    full.close()


def test_ray_reduces_one_task_per_rank_and_analyses_like_the_full_traces(cluster, run, tmp_path):
    out, traces, full = run
    fanout = reduce_paths([str(traces)], FanoutOptions(engine="ray", out=str(tmp_path / "ray")))
    assert [o.status for o in fanout.outcomes.values()] == ["reduced"] * NUM_RANKS
    assert sorted(o.rank for o in fanout.outcomes.values()) == list(range(NUM_RANKS))
    # each task ran in a Ray worker process, not in this driver
    workers = {o.result.worker for o in fanout.outcomes.values()}
    assert all(not w.endswith(f":{os.getpid()}") for w in workers) and 1 <= len(workers) <= NUM_RANKS
    con, result = analysed(tmp_path / "ray.duckdb", lambda c: ingest_fanout(c, fanout))
    try:
        assert result.num_ranks == NUM_RANKS and result.reduced_bytes > 0 and not result.warnings
        assert con.execute("SELECT count(*) FROM events").fetchone()[0] == 0
        assert full.execute("SELECT count(*) FROM match_instances").fetchone()[0] > 20
        assert_same_cross_rank_results(full, con)
        assert con.execute("SELECT list(rank) FROM stragglers_ranks WHERE flagged").fetchone()[0] == [1]
    finally:
        con.close()
    # the local engine (in this process) writes the same Parquet bytes as the Ray workers did
    local = reduce_paths([str(traces)], FanoutOptions(engine="local", workers=1, out=str(tmp_path / "local")))
    assert [o.status for o in local.outcomes.values()] == ["reduced"] * NUM_RANKS
    ray_outputs = sorted((tmp_path / "ray").glob("rank*.reduced"))
    assert len(ray_outputs) == NUM_RANKS
    assert parquet_digests(ray_outputs) == parquet_digests(sorted((tmp_path / "local").glob("rank*.reduced")))


def test_a_truncated_trace_fails_alone_and_the_rerun_completes_the_run(cluster, run, tmp_path):
    """Through the CLI, on the module's cluster by --address: exit 1 with one line naming the
    truncated trace; the other three ranks are reduced and ingested; the rerun reduces only it."""
    _, traces, full = run
    broken = tmp_path / "run"
    shutil.copytree(traces, broken)
    victim = broken / "rank2.json.gz"
    good = victim.read_bytes()
    victim.write_bytes(good[: len(good) // 2])
    db = tmp_path / "s.duckdb"
    cli = [sys.executable, "-m", "bprof.cli.main", "ingest", str(broken), "--engine", "ray", "--address", cluster,
           "--db", str(db)]
    first = subprocess.run(cli, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert first.returncode == 1, first.stderr[-3000:]
    errors = [line for line in first.stderr.splitlines() if line.startswith("bprof: error:")]
    assert errors == [f"bprof: error: {victim}: truncated gzip stream (the file ends before the compressed data does)"]
    assert "Traceback" not in first.stderr
    assert "3 of 4 ranks ingested (partial run; missing ranks 2)" in first.stderr
    assert sorted(p.name for p in broken.glob("*.reduced")) == ["rank0.reduced", "rank1.reduced", "rank3.reduced"]
    made = {p.name: p.stat().st_mtime_ns for p in broken.glob("*.reduced")}

    from bprof.store.db import open_store

    con = open_store(db)
    assert con.execute("SELECT list(num_ranks_ingested) FROM runs").fetchone()[0] == [3]
    con.close()

    victim.write_bytes(good)
    # into a store of its own, so that the tables compared below hold the complete run alone
    cli[-1] = str(tmp_path / "complete.duckdb")
    second = subprocess.run(cli + ["--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    done = json.loads(second.stdout)
    assert {o["trace"]: o["status"] for o in done["traces"]} == {
        str(broken / f"rank{r}.json.gz"): ("reduced" if r == 2 else "kept") for r in range(NUM_RANKS)}
    assert {p.name: p.stat().st_mtime_ns for p in broken.glob("*.reduced") if p.name in made} == made  # untouched
    [complete] = done["runs"]
    assert complete["created"] and complete["num_ranks"] == NUM_RANKS and not complete["warnings"]

    from bprof.analyzers import run as analysis
    from bprof.analyzers.base import Options

    con = open_store(tmp_path / "complete.duckdb")
    try:
        analysis.analyze_run(con, complete["run_id"], Options())
        assert_same_cross_rank_results(full, con)
    finally:
        con.close()
