"""device_peaks: stored, replaced on re-calibration, read back; a schema-1 store migrates to it."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from datetime import datetime, timezone

import duckdb
import pytest

from bprof.store.db import SCHEMA_VERSION, open_store
from bprof.store.peaks import MeasuredPeak, cpu_peak_for_host, load_peaks, save_peaks
from tests.conftest import ROOT

# the last commit whose store was schema 1 (before device_peaks)
SCHEMA_1_COMMIT = "15eb424304b6e7d1ea24fac58a51a807952d9958"

PEAK = MeasuredPeak(host="node1", device_kind="cpu", device_name="Intel(R) Xeon(R) Processor @ 2.80GHz",
                    dtype="fp32", num_threads=2, flops_per_s=2.5e11, flops_per_s_spread_frac=0.05,
                    mem_bytes_per_s=2.1e10, matmul_size=1024, num_repeats=5,
                    measured_at=datetime(2026, 11, 29, 18, 0, tzinfo=timezone.utc), torch_version="2.13.0+cpu")


def test_save_load_round_trip_and_filters(store):
    gpu = replace(PEAK, device_kind="cuda", device_name="NVIDIA H100 80GB HBM3", dtype="bf16", num_threads=8,
                  flops_per_s=7.1e14, flops_per_s_spread_frac=None, mem_bytes_per_s=None, torch_version=None)
    other_host = replace(PEAK, host="node2")
    save_peaks(store, [PEAK, gpu, other_host])
    assert load_peaks(store) == [PEAK, gpu, other_host]
    assert load_peaks(store, host="node1") == [PEAK, gpu]
    assert load_peaks(store, device_kind="cpu") == [PEAK, other_host]
    assert load_peaks(store, host="node2", device_kind="cuda") == []


def test_recalibrating_replaces_the_row(store):
    save_peaks(store, [PEAK])
    again = replace(PEAK, flops_per_s=2.6e11, measured_at=datetime(2026, 11, 30, tzinfo=timezone.utc))
    save_peaks(store, [again])
    assert load_peaks(store) == [again]


def test_save_is_one_transaction(store):
    save_peaks(store, [PEAK])
    bad = replace(PEAK, dtype="bf16", host=None)  # host is NOT NULL
    with pytest.raises(duckdb.ConstraintException):
        save_peaks(store, [replace(PEAK, dtype="fp16"), bad])
    assert load_peaks(store) == [PEAK]


def test_cpu_peak_for_host_is_the_whole_machine(store):
    one = replace(PEAK, num_threads=1, flops_per_s=1.3e11)
    whole = replace(PEAK, num_threads=2, flops_per_s=2.5e11)
    save_peaks(store, [one, whole, replace(PEAK, dtype="bf16", num_threads=4, flops_per_s=6e10),
                       replace(PEAK, device_kind="cuda", device_name="NVIDIA H200", num_threads=16, flops_per_s=5e14),
                       replace(PEAK, host="node2", num_threads=64)])
    assert cpu_peak_for_host(store, "node1", "fp32") == whole
    assert cpu_peak_for_host(store, "node1", "fp16") is None
    assert cpu_peak_for_host(store, "node3", "fp32") is None


def _schema_1_sql() -> str:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the schema-1 SQL is read from the repository's history")
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{SCHEMA_1_COMMIT}:bprof/store/schema.sql"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"commit {SCHEMA_1_COMMIT[:7]} is not in this checkout (shallow clone?): {done.stderr.strip()}")
    assert "schema version 1." in done.stdout
    return done.stdout


def _columns(con) -> list[tuple]:
    return con.execute("""
        SELECT table_name, column_index, column_name, data_type, is_nullable, comment FROM duckdb_columns()
        WHERE schema_name = 'main' ORDER BY ALL""").fetchall()


def _tables_and_constraints(con) -> list[tuple]:
    tables = con.execute("SELECT table_name, comment FROM duckdb_tables() WHERE schema_name = 'main' ORDER BY ALL")
    constraints = con.execute("""
        SELECT table_name, constraint_type, constraint_column_names FROM duckdb_constraints()
        WHERE schema_name = 'main' ORDER BY ALL""")
    return tables.fetchall() + constraints.fetchall()


def test_schema_1_store_migrates_to_the_same_schema_as_a_new_one(tmp_path):
    old = tmp_path / "v1.duckdb"
    con = duckdb.connect(str(old))
    con.execute(_schema_1_sql())
    con.execute("INSERT INTO meta VALUES ('schema_version', '1'), ('created_by', 'bprof')")
    con.execute("INSERT INTO metrics VALUES (1, 'step_time_ns', 5e8, 'ns', 'test')")
    con.close()
    with pytest.raises(Exception, match=f"schema 1 needs migrating to {SCHEMA_VERSION}"):
        open_store(old, read_only=True)

    migrated = open_store(old)
    fresh = open_store(tmp_path / "new.duckdb")
    try:
        assert migrated.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        assert migrated.execute("SELECT * FROM metrics").fetchall() == [(1, "step_time_ns", 5e8, "ns", "test")]
        assert _columns(migrated) == _columns(fresh)
        assert _tables_and_constraints(migrated) == _tables_and_constraints(fresh)
        save_peaks(migrated, [PEAK])
        save_peaks(migrated, [replace(PEAK, flops_per_s=3e11)])
        assert [p.flops_per_s for p in load_peaks(migrated)] == [3e11]
    finally:
        migrated.close()
        fresh.close()
