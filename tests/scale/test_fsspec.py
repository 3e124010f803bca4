"""Traces read where they are stored, through fsspec URLs: fsspec's in-memory filesystem (no local
path at all: the outputs go beside the traces in it, and ingest reads them back through DuckDB's
fsspec bridge) and file:// URLs (on the local process pool), each giving the same run as the full
traces; the trace is read as a stream, in bounded pieces, never fetched whole."""

from __future__ import annotations

import uuid

import pytest

fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed (pip install 'bprof[remote]')")
pytest.importorskip("upath", reason="universal-pathlib is not installed (pip install 'bprof[remote]')")

from fsspec.implementations.memory import MemoryFile, MemoryFileSystem  # noqa: E402

from bprof.cli.main import main  # noqa: E402
from bprof.scale.fanout import FanoutOptions, ingest_fanout, reduce_paths  # noqa: E402
from bprof.store.db import open_store  # noqa: E402
from tests.scale.runs import NUM_RANKS, analysed, full_reference, write_synthetic_run  # noqa: E402
from tests.store.test_reduce import assert_same_cross_rank_results  # noqa: E402


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("scale-fsspec")
    run = write_synthetic_run(out / "run")
    full, _ = full_reference(run, out / "full.duckdb")
    yield run, full
    full.close()


@pytest.fixture
def bucket(run):
    """The run's traces in a fresh bucket of the in-memory filesystem (removed afterwards)."""
    fs = MemoryFileSystem()
    name = f"bprof-{uuid.uuid4().hex[:8]}"
    for trace in sorted(run[0].glob("rank*.json.gz")):
        fs.pipe(f"/{name}/traces/{trace.name}", trace.read_bytes())
    yield fs, f"memory://{name}/traces"
    fs.rm(f"/{name}", recursive=True)


def test_memory_urls_reduce_beside_the_traces_and_ingest_like_the_full_run(run, bucket, tmp_path, monkeypatch):
    fs, url = bucket
    reads = []
    fetched = []
    original_read = MemoryFile.read

    def read(self, size=-1):
        reads.append(size)
        return original_read(self, size)

    monkeypatch.setattr(MemoryFile, "read", read)
    for whole in ("cat_file", "get_file", "get"):  # fetching a file whole (to memory or to disk)
        monkeypatch.setattr(MemoryFileSystem, whole, lambda self, *a, _w=whole, **k: fetched.append(_w))
    fanout = reduce_paths([url], FanoutOptions(engine="local", workers=1))
    assert [o.status for o in fanout.outcomes.values()] == ["reduced"] * NUM_RANKS, [o.error for o in fanout.failed]
    assert fetched == [] and reads and all(size is not None and 0 < size <= 8 << 20 for size in reads)
    monkeypatch.undo()
    assert sorted(fs.ls(url.removeprefix("memory://"), detail=False)) == sorted(
        [f"/{url.removeprefix('memory://')}/rank{r}{s}" for r in range(NUM_RANKS) for s in (".json.gz", ".reduced")])
    con, result = analysed(tmp_path / "m.duckdb", lambda c: ingest_fanout(c, fanout))
    try:
        assert result.num_ranks == NUM_RANKS and not result.warnings
        assert con.execute("SELECT list(path ORDER BY rank) FROM reduced_ranks").fetchone()[0] == [
            f"{url}/rank{r}.reduced" for r in range(NUM_RANKS)]
        assert_same_cross_rank_results(run[1], con)
    finally:
        con.close()
    # a rerun finds every output complete and reduces nothing
    again = reduce_paths([url], FanoutOptions(engine="local", workers=1))
    assert [o.status for o in again.outcomes.values()] == ["kept"] * NUM_RANKS


def test_a_damaged_output_on_the_store_is_reduced_again(bucket):
    fs, url = bucket
    reduce_paths([url + "/rank0.json.gz"], FanoutOptions(workers=1))
    path = url.removeprefix("memory://") + "/rank0.reduced/steps.parquet"
    fs.pipe(path, fs.cat_file(path)[:-10])  # truncated: its manifest's size and sha256 no longer match
    again = reduce_paths([url + "/rank0.json.gz"], FanoutOptions(workers=1))
    assert [(o.status, o.out) for o in again.outcomes.values()] == [("reduced", f"{url}/rank0.reduced")]


def test_file_urls_through_the_cli_on_the_process_pool(run, tmp_path, capsys):
    traces, full = run
    db = tmp_path / "f.duckdb"
    args = ["ingest", f"file://{traces}", "--engine", "local", "--out", f"file://{tmp_path}/out", "--db", str(db)]
    assert main(args) == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"rank{r}.reduced" for r in range(NUM_RANKS)]
    assert not list(traces.glob("*.reduced"))  # --out: nothing written beside the traces
    con = open_store(db)
    try:
        [(run_id,)] = con.execute("SELECT run_id FROM runs").fetchall()
        from bprof.analyzers import run as analysis
        from bprof.analyzers.base import Options

        analysis.analyze_run(con, run_id, Options())
        assert_same_cross_rank_results(full, con)
    finally:
        con.close()
    capsys.readouterr()
    assert main(["reduce", f"file://{traces}", "--out", f"file://{tmp_path}/out"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"0 reduced, {NUM_RANKS} kept, 0 failed of {NUM_RANKS} traces"


@pytest.mark.parametrize("args, message", [
    (["ingest", "memory://nowhere/run"], "memory://nowhere/run: a URL is ingested through its reduce: add --engine local or ray"),
    (["reduce", "nosuchprotocol://bucket/run"], "nosuchprotocol://bucket/run: fsspec cannot open this URL"),
    (["reduce", "memory://bprof-missing/run"], "memory://bprof-missing/run: no such file or directory"),
    (["reduce", "memory://bprof-missing/run", "--address", "127.0.0.1:6379"], "--address names a Ray cluster: it needs --engine ray"),
])
def test_bad_urls_and_flags_are_one_line_exit_2(args, message, tmp_path, capsys):
    assert main(args + (["--db", str(tmp_path / "s.duckdb")] if args[0] == "ingest" else [])) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"bprof: error: {message}"), err


def test_engine_ray_without_ray_installed_is_one_line_exit_2(run, monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # `import ray` raises ImportError
    assert main(["reduce", str(run[0]), "--engine", "ray"]) == 2
    assert capsys.readouterr().err.strip() == "bprof: error: --engine ray needs Ray: pip install 'bprof[ray]'"
    assert not list(run[0].glob("*.reduced"))
