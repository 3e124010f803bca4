"""Every real trace generation in ../shared/traces ingests with the right rank, device, steps,
kernels and collectives, as computed independently by expected_counts.py."""

from __future__ import annotations

import pytest

from bprof.store.ingest import IngestOptions, ingest_paths
from tests.conftest import shared_trace
from tests.store.expected_counts import expected

# folder -> rank to pass when the trace does not record one
FIXTURES = {
    "a100_ddp_nccl_rank0": None,
    "a100_ws16_rank0": None,
    "cpu_gloo_rank34": None,
    "mi250_rocm_minitoy": 0,
    "v100_ns_resolution_rank0": None,
    "v100_resnet50_legacy_2021": 0,
}


@pytest.mark.parametrize("folder", sorted(FIXTURES))
def test_real_trace_matches_independent_counts(store, folder):
    path = shared_trace(folder)
    trace_file = next(path.iterdir())
    want = expected(trace_file)
    [result] = ingest_paths(store, [path], IngestOptions(rank=FIXTURES[folder]))
    run = result.run_id

    rank, device, num_events = store.execute(
        "SELECT rank, device_name, num_events FROM ranks WHERE run_id = ?", [run]).fetchone()
    assert rank == (want["rank"] if want["rank"] is not None else FIXTURES[folder])
    assert device == want["device_name"]
    assert num_events == want["num_events"]
    assert store.execute("SELECT count(*) FROM steps WHERE run_id = ?", [run]).fetchone()[0] == want["num_steps"]
    assert store.execute("SELECT count(*) FROM events WHERE run_id = ? AND kind = 'kernel'",
                         [run]).fetchone()[0] == want["num_kernels"]
    got = dict(store.execute("SELECT op, count(*) FROM collectives WHERE run_id = ? GROUP BY op", [run]).fetchall())
    assert got == want["collectives"]
    assert dict(store.execute("SELECT step, count(*) FROM events WHERE run_id = ? AND kind = 'kernel' GROUP BY step",
                              [run]).fetchall()) == want["kernel_steps"]
    assert {(op, n): k for op, n, k in store.execute(
        "SELECT op, in_elems, count(*) FROM collectives WHERE run_id = ? AND source = 'c10d' GROUP BY ALL",
        [run]).fetchall()} == want["c10d_elems"]


def test_a100_ddp_has_15_all_reduce_and_6_broadcast_and_waits_are_not_collectives(store):
    path = shared_trace("a100_ddp_nccl_rank0")
    [result] = ingest_paths(store, [path])
    rows = store.execute("""
        SELECT op, count(*), min(in_bytes), sum(num_kernels), any_value(pg_ranks), any_value(pg_desc)
        FROM collectives WHERE run_id = ? GROUP BY op ORDER BY op""", [result.run_id]).fetchall()
    assert rows == [("all_reduce", 15, rows[0][2], 15, [0, 1], "default_pg"),
                    ("broadcast", 6, rows[1][2], 6, [0, 1], "default_pg")]
    assert expected(next(path.iterdir()))["num_wait_records"] == 6
    # bytes are elements x element size: Float 4, Long 8 (the trace has both)
    sizes = store.execute("SELECT DISTINCT dtype, in_bytes // in_elems FROM collectives WHERE run_id = ? ORDER BY 1",
                          [result.run_id]).fetchall()
    assert sizes == [("Float", 4), ("Long", 8)]


def test_times_are_exact_integer_ns_for_every_time_base(store):
    """Relative-to-base and absolute traces land on the same epoch scale, to the nanosecond."""
    import gzip
    import json
    from decimal import Decimal

    for folder, rank in (("a100_ddp_nccl_rank0", None), ("v100_ns_resolution_rank0", None),
                         ("v100_resnet50_legacy_2021", 0)):
        path = shared_trace(folder)
        trace = json.load(gzip.open(next(path.iterdir())), parse_float=Decimal)  # every digit kept
        base = trace.get("baseTimeNanoseconds", 0)
        first = next(e for e in trace["traceEvents"] if e.get("ph") == "X")
        [result] = ingest_paths(store, [path], IngestOptions(rank=rank))
        want_ns = base + int(Decimal(first["ts"]) * 1000)
        found = store.execute("SELECT count(*) FROM events WHERE run_id = ? AND name = ? AND ts_ns = ?",
                              [result.run_id, first["name"], want_ns]).fetchone()[0]
        assert found >= 1
        ts_ns = want_ns
        # all runs are on the epoch: between 2020 and 2030
        assert 1_577_836_800 * 10**9 < ts_ns < 1_893_456_000 * 10**9


def test_gpu_events_take_the_step_of_their_launch(store):
    path = shared_trace("a100_ddp_nccl_rank0")
    [result] = ingest_paths(store, [path])
    mismatched = store.execute("""
        SELECT count(*) FROM events k JOIN events l
          ON l.run_id = k.run_id AND l.kind IN ('cuda_runtime', 'cuda_driver') AND l.correlation = k.correlation
        WHERE k.run_id = ? AND k.kind = 'kernel' AND l.step IS NOT NULL AND k.step IS DISTINCT FROM l.step""",
        [result.run_id]).fetchone()[0]
    assert mismatched == 0
    assert store.execute("SELECT count(*) FROM events WHERE run_id = ? AND kind = 'kernel' AND step IS NULL",
                         [result.run_id]).fetchone()[0] < 10
