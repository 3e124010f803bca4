"""`bprof reduce` and ingest of its outputs: a run loaded from reduced ranks analyses to the same
cross-rank results as the run loaded from the full traces (real torchrun recordings and synthetic
runs), at a fraction of the bytes; bad reduced input is one clear error and leaves the store as it was."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.analyzers.reduce import reduce_trace
from bprof.cli.main import main
from bprof.errors import DataError, UsageError
from bprof.store.db import SCHEMA_VERSION, open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.store.reduce import FORMAT_VERSION, MANIFEST, file_sha256
from bprof.synth import Fault, Scenario, write_run
from tests.analyzers.recorded import record_train_gpt
from tests.conftest import ROOT
from tests.store.test_bad_input import snapshot
from tests.store.tiny_traces import modern_trace, write

# What cross-rank analysis computes, table -> columns that order its rows. The reduced run must
# give exactly these rows (run_id aside).
CROSS_RANK_TABLES = {
    "ranks": "rank", "steps": "rank, step", "collectives": "rank, call_index", "clock_samples": "rank, phase, send_ns",
    "timeline_spans": "rank, step", "breakdown_steps": "rank, step", "breakdown_ranks": "rank",
    "breakdown_groups": "pg_name, pg_desc", "breakdown_dims": "rank, step, dim",
    "match_instances": "ALL", "match_members": "ALL", "clock_hosts": "host",
    "collperf_instances": "ALL", "collperf_waits": "ALL", "collperf_groups": "ALL",
    "bubbles_stages": "ALL", "bubbles_runs": "ALL", "stragglers_ranks": "rank",
}
CROSS_RANK_ANALYZERS = ("breakdown", "match", "clock", "collperf", "bubbles", "stragglers")
# ranks.trace_path says where each trace was read: the same file, spelled as each side was given it
NOT_COMPARED = {"ranks": ("trace_path",)}


def table_rows(con, table: str, order: str) -> list[tuple]:
    """Every row of `table` but run_id (and NOT_COMPARED columns), in a stable order."""
    columns = [c for (c,) in con.execute(
        "SELECT column_name FROM duckdb_columns() WHERE table_name = ? AND column_name <> 'run_id' ORDER BY column_index",
        [table]).fetchall() if c not in NOT_COMPARED.get(table, ())]
    # names come from the store's own catalogue and this file's constants
    return con.execute(f"SELECT {', '.join(columns)} FROM {table} ORDER BY {order}").fetchall()


def cross_rank_findings(con) -> list[tuple]:
    return con.execute("""SELECT analyzer, severity, lost_ns, title, evidence FROM findings
                          WHERE analyzer IN (SELECT unnest(?)) ORDER BY ALL""", [list(CROSS_RANK_ANALYZERS)]).fetchall()


def assert_same_cross_rank_results(full, reduced) -> None:
    for table, order in CROSS_RANK_TABLES.items():
        assert table_rows(reduced, table, order) == table_rows(full, table, order), table
    assert cross_rank_findings(reduced) == cross_rank_findings(full)
    step_time = "SELECT value FROM metrics WHERE name IN ('step_time_ns', 'step_time_max_ns', 'num_steps') ORDER BY name"
    assert reduced.execute(step_time).fetchall() == full.execute(step_time).fetchall()


def assert_reduced_views_say_not_available(con, ranks: list[int]) -> None:
    """Per-rank views that need events have no rows for reduced ranks, and one finding says so."""
    for table in ("phases_steps", "kernels_flops", "launch_steps", "idle_causes", "breakdown_idle_gaps"):
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    [(severity, evidence)] = con.execute(
        "SELECT severity, evidence FROM findings WHERE analyzer = 'timeline' AND title LIKE 'Kernels, phases%'").fetchall()
    assert severity == "not_measurable" and json.loads(evidence)["ranks"] == ranks


# -- (a) a real 2-rank torchrun recording under bprof record --reduce ---------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """train_gpt.py on 2 CPU ranks as a 2-stage pipeline (send/recv, bubbles), recorded with --reduce:
    the record CLI ingests the full traces into one store; the reduced outputs go into another.
    Both are analysed with `bprof analyze --json`."""
    out = tmp_path_factory.mktemp("reduce-recorded")
    full_db = record_train_gpt(out, "pp2", ["--dp", "1", "--pp", "2"], record_args=["--reduce"])
    run_dir = out / "pp2"
    reduced_db = out / "reduced.duckdb"
    cli = [sys.executable, "-m", "bprof.cli.main"]
    ingested = subprocess.run([*cli, "ingest", "--reduced", str(run_dir), "--db", str(reduced_db)],
                              capture_output=True, text=True, timeout=120, cwd=out)
    assert ingested.returncode == 0, ingested.stderr
    summaries = []
    for db in (full_db, reduced_db):
        done = subprocess.run([*cli, "analyze", "--db", str(db), "--json"], capture_output=True, text=True,
                              timeout=300, cwd=out)
        assert done.returncode == 0, done.stderr[-3000:]
        summaries.append(json.loads(done.stdout))
    return run_dir, full_db, reduced_db, summaries


@pytest.mark.slow
def test_recorded_reduced_run_analyses_like_the_full_one(recorded):
    run_dir, full_db, reduced_db, (full_summary, reduced_summary) = recorded
    full, reduced = duckdb.connect(str(full_db), read_only=True), duckdb.connect(str(reduced_db), read_only=True)
    assert reduced.execute("SELECT count(*) FROM events").fetchone()[0] == 0
    assert reduced.execute("SELECT list(rank ORDER BY rank) FROM reduced_ranks").fetchone()[0] == [0, 1]
    # the comparison has something to compare: matched send/recv pairs, a pipeline, steps
    assert full.execute("SELECT count(*) FROM match_instances").fetchone()[0] >= 12
    assert full.execute("SELECT count(*) FROM bubbles_stages").fetchone()[0] >= 2
    assert_same_cross_rank_results(full, reduced)
    assert reduced_summary["ranks"] == full_summary["ranks"]  # bprof analyze's per-rank partition
    assert reduced_summary["metrics"]["step_time_ns"] == full_summary["metrics"]["step_time_ns"]
    assert_reduced_views_say_not_available(reduced, [0, 1])
    # the full run has the views the reduced one lacks
    assert full.execute("SELECT count(*) FROM phases_steps").fetchone()[0] > 0


@pytest.mark.slow
def test_recorded_reduced_outputs_are_a_small_fraction_of_the_traces(recorded):
    run_dir = recorded[0]
    traces = sorted(run_dir.glob("traces/iteration_*/rank*.json.gz"))
    reduced = sorted(run_dir.glob("traces/iteration_*/rank*.reduced"))
    assert [t.name.split(".")[0] for t in traces] == [r.name.split(".")[0] for r in reduced] == ["rank0", "rank1"]
    trace_bytes = sum(t.stat().st_size for t in traces)
    reduced_bytes = sum(f.stat().st_size for r in reduced for f in r.iterdir())
    print(f"reduced {reduced_bytes:,} bytes vs traces {trace_bytes:,} bytes (gzip): 1/{trace_bytes / reduced_bytes:.0f}")
    # measured on this 2-rank pipeline: about 39 kB against 1.1 MB of gzip traces, 1/28
    assert reduced_bytes * 10 < trace_bytes
    for r in reduced:  # every file is checked by its manifest, and the traces' own metadata is kept
        manifest = json.loads((r / MANIFEST).read_text())
        assert manifest["version"] == FORMAT_VERSION and manifest["trace"]["window"] == "iteration_3"
        assert manifest["metadata"]["bprof_record"]["command"] and "clock_sync" not in manifest["metadata"]["bprof_record"]


@pytest.mark.slow
def test_a_failing_reduce_leaves_the_trace_and_warns(tmp_path):
    """bprof record --reduce where the reduce cannot run (its interpreter is /bin/false): the
    recording and its ingest go on, the rank says why on stderr and in its metadata."""
    from tests.profiler.test_record import TOY, record

    done = record(tmp_path, "--reduce", "--steps", "2:4", script=TOY, script_args=["--steps", "5"],
                  env={"BPROF_PYTHON": "/bin/false"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warning: bprof reduce of rank0.json.gz failed (exit code 1); the trace is complete" in done.stderr
    assert "0 of 1 traces reduced" in done.stderr and "ingested run" in done.stderr
    assert (tmp_path / "run" / "traces" / "iteration_2" / "rank0.json.gz").exists()
    assert not list((tmp_path / "run").rglob("*.reduced"))
    meta = json.loads((tmp_path / "run" / "meta" / "rank0.json").read_text())
    assert any("bprof reduce of rank0.json.gz failed" in note for note in meta["notes"])


# -- (b) synthetic multi-rank runs, reduced rank by rank --------------------------------------


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """An 8-GPU tp2·pp2·dp2 NCCL run on 2 hosts with skewed clocks and a slow rank, ingested from
    its traces into one store and from `bprof reduce` of each rank into another; both analysed."""
    out = tmp_path_factory.mktemp("reduce-synth")
    write_run(Scenario(tp=2, pp=2, dp=2, steps=3, hosts=2, seed=3, clock_jitter_ns=5_000,
                       clock_offset_ns={0: 0, 1: 350_000}, faults=[Fault("slow_rank", rank=3, extra_ns=20_000_000)]),
              out / "run")
    results = [reduce_trace(trace, out / "reduced" / f"{trace.name.split('.')[0]}.reduced")
               for trace in sorted((out / "run").glob("rank*.json.gz"))]
    stores = []
    for name, path in (("full", out / "run"), ("reduced", out / "reduced")):
        con = open_store(out / f"{name}.duckdb")
        [r] = ingest_paths(con, [path], IngestOptions(name=name))
        analysis.analyze_run(con, r.run_id, Options())
        stores.append(con)
    yield results, *stores
    for con in stores:
        con.close()


def test_synthetic_reduced_run_analyses_like_the_full_one(synthetic):
    results, full, reduced = synthetic
    assert [r.rank for r in results] == list(range(8))
    assert full.execute("SELECT count(*) FROM match_instances").fetchone()[0] > 50
    assert_same_cross_rank_results(full, reduced)
    assert_reduced_views_say_not_available(reduced, list(range(8)))
    # the device timeline's last step ends with the device, which only the events knew
    assert reduced.execute("SELECT count(DISTINCT timeline) FROM timeline_spans").fetchone()[0] == 1
    assert reduced.execute("SELECT any_value(timeline) FROM timeline_spans").fetchone()[0] == "device"


def test_synthetic_slow_rank_is_found_from_the_reduced_ranks(synthetic):
    reduced = synthetic[2]
    assert reduced.execute("SELECT list(rank) FROM stragglers_ranks WHERE flagged").fetchone()[0] == [3]


def test_reduced_ranks_per_dimension_time_is_the_reduces_own(synthetic):
    """breakdown_dims of reduced ranks is copied from reduced_dims, not recomputed from the run's
    collectives: without rank 0's collectives it stays the same; a changed reduced_dims row shows."""
    from bprof.analyzers import breakdown
    from bprof.analyzers.base import replace_rows

    reduced = synthetic[2]
    [(run_id,)] = reduced.execute("SELECT run_id FROM runs").fetchall()
    dims = "SELECT step, dim, comm_ns, exposed_comm_ns FROM breakdown_dims WHERE rank = 0 ORDER BY step, dim"
    before = reduced.execute(dims).fetchall()
    assert {d for _, d, _, _ in before} == {"tp", "pp", "dp"} and all(c > 0 for _, _, c, _ in before)
    reduced.execute("BEGIN TRANSACTION")
    try:
        reduced.execute("DELETE FROM collectives WHERE rank = 0")
        replace_rows(reduced, breakdown.TABLES, run_id)
        breakdown.analyze(reduced, run_id, Options())
        assert reduced.execute(dims).fetchall() == before
        reduced.execute("UPDATE reduced_dims SET comm_ns = comm_ns + 1 WHERE rank = 0")
        replace_rows(reduced, breakdown.TABLES, run_id)
        breakdown.analyze(reduced, run_id, Options())
        assert reduced.execute(dims).fetchall() == [(s, d, c + 1, e) for s, d, c, e in before]
    finally:
        reduced.execute("ROLLBACK")


def test_reduce_reports_rows_and_bytes(synthetic):
    results = synthetic[0]
    r = results[0]
    assert r.rows["ranks"] == 1 and r.rows["steps"] == 3 and r.rows["spans"] == 3 and r.rows["collectives"] > 10
    on_disk = sum(f.stat().st_size for f in r.out.iterdir())
    assert r.reduced_bytes == on_disk == sum(r.bytes.values())
    assert r.trace_bytes == (r.trace.stat().st_size) and r.trace_json_bytes > r.trace_bytes
    print(f"synthetic rank 0: {r.reduced_bytes:,} bytes from a {r.trace_bytes:,}-byte trace "
          f"({r.trace_json_bytes:,} bytes of JSON) in {r.seconds:.2f} s: 1/{1 / r.trace_ratio:.0f}")
    # measured: 23 kB from a 152 kB gzip trace (1/6; 1/62 of its 1.5 MB of JSON). Parquet's fixed cost per
    # file dominates at this size; real GPU traces of ../shared reduce to 1/39-1/69 of their gzip files
    assert r.trace_ratio < 0.25 and r.reduced_bytes * 20 < r.trace_json_bytes


# -- (c) bad input: one clear error naming the file, the store untouched ----------------------


@pytest.fixture
def tiny_reduced(tmp_path):
    """Two ranks of a tiny gloo trace, reduced into tmp_path/reduced (the traces stay elsewhere)."""
    for rank in range(2):
        write(tmp_path / "traces" / f"rank{rank}.json.gz", modern_trace(rank))
        reduce_trace(tmp_path / "traces" / f"rank{rank}.json.gz", tmp_path / "reduced" / f"rank{rank}.reduced")
    return tmp_path / "reduced"


@pytest.fixture
def good_store(store, tmp_path):
    """A store that already holds a run, so that 'unchanged' is not trivially 'empty'."""
    for rank in range(2):
        write(tmp_path / "good" / f"rank{rank}.json.gz", modern_trace(rank))
    ingest_paths(store, [tmp_path / "good"])
    return store, snapshot(store)


def _bad(store, before, path: Path, message: str, capsys, db: Path) -> None:
    with pytest.raises(DataError, match=message):
        ingest_paths(store, [path])
    assert snapshot(store) == before
    store.close()  # the CLI opens the same file: one line on stderr, exit code 3 (bad data)
    assert main(["ingest", str(path), "--db", str(db)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("bprof: error: ") and str(path) in err, err


def test_truncated_parquet(tiny_reduced, good_store, tmp_path, capsys):
    store, before = good_store
    steps = tiny_reduced / "rank1.reduced" / "steps.parquet"
    steps.write_bytes(steps.read_bytes()[:100])
    _bad(store, before, tiny_reduced, r"rank1\.reduced/steps\.parquet: 100 bytes, but its manifest says \d+ \(truncated",
         capsys, tmp_path / "bprof.duckdb")


def test_corrupt_parquet_of_the_right_size(tiny_reduced, good_store, tmp_path, capsys):
    store, before = good_store
    spans = tiny_reduced / "rank0.reduced" / "spans.parquet"
    data = bytearray(spans.read_bytes())
    data[len(data) // 2] ^= 0xFF
    spans.write_bytes(bytes(data))
    _bad(store, before, tiny_reduced, r"rank0\.reduced/spans\.parquet: its sha256 differs", capsys, tmp_path / "bprof.duckdb")


def test_unreadable_parquet_that_its_manifest_vouches_for(tiny_reduced, good_store, tmp_path, capsys):
    """A file that is not Parquet at all, listed with its true size and sha256: DuckDB's error,
    with the file named."""
    store, before = good_store
    d = tiny_reduced / "rank1.reduced"
    (d / "collectives.parquet").write_bytes(b"not parquet" * 40)
    manifest = json.loads((d / MANIFEST).read_text())
    manifest["tables"]["collectives"].update(bytes=440, sha256=file_sha256(d / "collectives.parquet"))
    (d / MANIFEST).write_text(json.dumps(manifest))
    _bad(store, before, tiny_reduced, r"rank1\.reduced/collectives\.parquet: unreadable Parquet", capsys,
         tmp_path / "bprof.duckdb")


def test_duplicate_rank(tiny_reduced, good_store, tmp_path, capsys):
    store, before = good_store
    shutil.copytree(tiny_reduced / "rank1.reduced", tiny_reduced / "rank1-again.reduced")
    _bad(store, before, tiny_reduced, r"rank1(-again)?\.reduced: duplicate rank 1 in one run \(also in .*rank1",
         capsys, tmp_path / "bprof.duckdb")


def test_format_version_mismatch(tiny_reduced, good_store, tmp_path, capsys):
    store, before = good_store
    path = tiny_reduced / "rank0.reduced" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["version"] = FORMAT_VERSION + 1
    path.write_text(json.dumps(manifest))
    _bad(store, before, tiny_reduced, rf"rank0\.reduced/manifest\.json: reduced format version {FORMAT_VERSION + 1}, "
         rf"but this bprof reads version {FORMAT_VERSION}", capsys, tmp_path / "bprof.duckdb")


def test_a_manifest_without_dims(tiny_reduced, good_store, tmp_path, capsys):
    """An output of a development bprof from before dims.parquet (same format version): refused."""
    store, before = good_store
    d = tiny_reduced / "rank0.reduced"
    manifest = json.loads((d / MANIFEST).read_text())
    del manifest["tables"]["dims"]
    (d / MANIFEST).write_text(json.dumps(manifest))
    (d / "dims.parquet").unlink()
    _bad(store, before, tiny_reduced, r"rank0\.reduced/manifest\.json: the manifest lists no dims\.parquet; run `bprof "
         r"reduce` on the rank's trace again", capsys, tmp_path / "bprof.duckdb")


def test_an_unfinished_output_without_manifest(tiny_reduced, good_store, tmp_path, capsys):
    store, before = good_store
    (tiny_reduced / "rank1.reduced" / MANIFEST).unlink()
    _bad(store, before, tiny_reduced, r"rank1\.reduced/manifest\.json: cannot read the manifest", capsys,
         tmp_path / "bprof.duckdb")


def test_ranks_of_two_runs(good_store, tmp_path, capsys):
    """Reduced ranks of two bprof record runs (their run ids differ) in one directory."""
    store, before = good_store
    for rank, run_id in ((0, "20261129-1"), (1, "20261129-2")):
        trace = modern_trace(rank)
        trace["bprof"] = {"run_id": run_id, "rank": rank}
        write(tmp_path / "traces" / f"rank{rank}.json.gz", trace)
        reduce_trace(tmp_path / "traces" / f"rank{rank}.json.gz", tmp_path / "mixed" / f"rank{rank}.reduced")
    _bad(store, before, tmp_path / "mixed", r"rank1\.reduced: from another run than .*rank0\.reduced "
         r"\(bprof run id '20261129-2' against '20261129-1'\)", capsys, tmp_path / "bprof.duckdb")


def test_ranks_of_jobs_of_different_sizes(good_store, tmp_path, capsys):
    store, before = good_store
    for rank, world_size in ((0, 2), (1, 4)):
        write(tmp_path / "traces" / f"rank{rank}.json.gz", modern_trace(rank, world_size=world_size))
        reduce_trace(tmp_path / "traces" / f"rank{rank}.json.gz", tmp_path / "mixed" / f"rank{rank}.reduced")
    _bad(store, before, tmp_path / "mixed", r"rank1\.reduced: from another run .*\(world size 4 against 2\)", capsys,
         tmp_path / "bprof.duckdb")


def test_traces_and_reduced_outputs_are_not_one_run(tiny_reduced, tmp_path, store):
    with pytest.raises(UsageError, match="is a reduced output and .* a trace"):
        ingest_paths(store, [tiny_reduced / "rank0.reduced", tmp_path / "traces" / "rank1.json.gz"])


# -- discovery, idempotence, the CLI ----------------------------------------------------------


def test_reduced_outputs_beside_traces(tiny_reduced, tmp_path, store):
    """A folder with both: its traces by default, its reduced outputs with --reduced (IngestOptions.reduced);
    ingesting the same reduced outputs again changes nothing."""
    both = tmp_path / "both"
    shutil.copytree(tmp_path / "traces", both)
    shutil.copytree(tiny_reduced, both, dirs_exist_ok=True)
    [traces] = ingest_paths(store, [both])
    assert traces.num_events > 0 and traces.reduced_bytes == 0
    [reduced] = ingest_paths(store, [both], IngestOptions(reduced=True))
    assert reduced.created and reduced.num_ranks == 2 and reduced.num_events == 0 and reduced.reduced_bytes > 0
    assert store.execute("SELECT count(*) FROM events WHERE run_id = ?", [reduced.run_id]).fetchone()[0] == 0
    [again] = ingest_paths(store, [both], IngestOptions(reduced=True))
    assert not again.created and again.run_id == reduced.run_id
    [one] = ingest_paths(store, [tiny_reduced / "rank1.reduced"])  # a single rank: a partial run
    assert one.created and any("1 of 2 ranks ingested" in w for w in one.warnings)


def test_cli_reduce_json_and_default_output_beside_the_trace(tmp_path, capsys):
    write(tmp_path / "run" / "rank1.json.gz", modern_trace(1))
    assert main(["reduce", str(tmp_path / "run" / "rank1.json.gz"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rank"] == 1 and out["out"] == str(tmp_path / "run" / "rank1.reduced")
    assert out["rows"] == {"ranks": 1, "steps": 2, "collectives": 2, "clock_samples": 0, "spans": 2, "breakdown": 2,
                           "exposed_comm": out["rows"]["exposed_comm"], "dims": out["rows"]["dims"]}
    assert out["rows"]["dims"] > 0
    assert out["reduced_bytes"] == sum(out["bytes"].values()) and 0 < out["trace_ratio"]
    # a second reduce replaces the first, whole; a path that is not a reduced output is refused
    assert main(["reduce", str(tmp_path / "run" / "rank1.json.gz")]) == 0
    assert "reduced rank 1 of" in capsys.readouterr().out
    assert main(["reduce", str(tmp_path / "run" / "rank1.json.gz"), "--out", str(tmp_path / "run")]) == 2
    assert "is not a reduced output" in capsys.readouterr().err


def test_reduce_and_its_ingest_do_not_need_torch(tmp_path):
    """(the torch-blocking import hook of tests/test_no_torch.py, around bprof reduce and ingest)"""
    from tests.test_no_torch import BLOCK_TORCH

    write(tmp_path / "rank0.json.gz", modern_trace(0))
    script = BLOCK_TORCH.split("import bprof,")[0] + """
from bprof.cli.main import main
assert main(['reduce', sys.argv[1] + '/rank0.json.gz']) == 0
assert 'torch' not in sys.modules
sys.exit(main(['ingest', sys.argv[1] + '/rank0.reduced', '--db', sys.argv[1] + '/s.duckdb']))
"""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "from reduced outputs: 1 ranks" in done.stdout


# -- the schema ---------------------------------------------------------------------------------

# the last commit whose store was schema 2 (before the reduced_* tables)
SCHEMA_2_COMMIT = "1546dd9d4ef58da36cc7e27fba8dfcdc4333c2b0"


def test_schema_2_store_migrates_to_the_same_schema_as_a_new_one(tmp_path):
    from tests.store.test_peaks import _columns, _tables_and_constraints

    if shutil.which("git") is None:
        pytest.skip("git is not installed: the schema-2 SQL is read from the repository's history")
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{SCHEMA_2_COMMIT}:bprof/store/schema.sql"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"commit {SCHEMA_2_COMMIT[:7]} is not in this checkout (shallow clone?): {done.stderr.strip()}")
    assert "schema version 2." in done.stdout
    con = duckdb.connect(str(tmp_path / "v2.duckdb"))
    con.execute(done.stdout)
    con.execute("INSERT INTO meta VALUES ('schema_version', '2'), ('created_by', 'bprof')")
    con.close()
    migrated, fresh = open_store(tmp_path / "v2.duckdb"), open_store(tmp_path / "new.duckdb")
    try:
        assert migrated.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        assert _columns(migrated) == _columns(fresh)
        assert _tables_and_constraints(migrated) == _tables_and_constraints(fresh)
    finally:
        migrated.close()
        fresh.close()
