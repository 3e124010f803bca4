"""Ingest of a `bprof export --perfetto` file (bprof.store.chrome_export): a hand-written two-rank
export splits back into its ranks with raw pids, tids and flow ids, drops what the exporter added
for display, and gives its collective calls the identity the export carries; a malformed one is bad
data that leaves the store as it was."""

from __future__ import annotations

import json

import pytest

from bprof.errors import DataError
from bprof.store.ingest import IngestOptions, ingest_paths

BASE_NS = 1_790_857_026_000_000_000


def export(calls_seq=(7, 7)) -> dict:
    events = []
    for rank in (0, 1):
        cpu, worker = (rank + 1) * 65536, (rank + 1) * 65536 + 1
        events += [
            {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": rank, "tid": cpu,
             "ts": 0.001, "dur": 1000.0, "args": {"External id": 1}},
            {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": rank, "tid": cpu, "ts": 100.5 + rank,
             "dur": 40.25, "args": {"External id": 2, "bprof.collective": {
                 "op": "all_reduce", "pg_name": "3", "pg_desc": "DATA_PARALLEL_GROUP", "pg_ranks": [0, 1],
                 "group_size": 2, "seq": calls_seq[rank], "peer_rank": None, "dtype": "float", "in_elems": 1000,
                 "out_elems": None, "in_bytes": 4000, "out_bytes": None}}},
            {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": rank, "tid": worker,
             "ts": 120.0, "dur": 300.0, "args": {"External id": 3}},
            {"ph": "s", "cat": "fwdbwd", "name": "fwdbwd", "pid": rank, "tid": cpu, "ts": 10.0, "id": 2 + rank,
             "bprof_id": 17},
            {"ph": "f", "cat": "fwdbwd", "name": "fwdbwd", "pid": rank, "tid": worker, "ts": 130.0, "id": 2 + rank,
             "bp": "e", "bprof_id": 17},
            {"ph": "M", "name": "thread_name", "pid": rank, "tid": worker, "args": {"name": "thread (gloo)"}},
        ]
    events += [{"ph": "s", "cat": "bprof.match", "name": "all_reduce #7", "id": 1, "pid": 0, "tid": 65537, "ts": 200.0},
               {"ph": "f", "cat": "bprof.match", "name": "all_reduce #7", "id": 1, "pid": 1, "tid": 131073,
                "ts": 200.0, "bp": "e"}]
    ranks = [{"rank": r, "host": f"h{r}", "local_rank": 0,
              "distributedInfo": {"backend": "gloo", "rank": r, "world_size": 2},
              "threads": [{"tid": (r + 1) * 65536, "pid": str(100 + r), "raw_tid": str(100 + r)},
                          {"tid": (r + 1) * 65536 + 1, "pid": str(100 + r), "raw_tid": "gloo worker"}]}
             for r in (0, 1)]
    return {"traceEvents": events,
            "bprofExport": {"format": "bprof-perfetto", "version": 1, "step": 4, "base_time_ns": BASE_NS,
                            "run": {"name": "orig", "model_flops_per_step": 1e9}, "ranks": ranks}}


def test_an_export_splits_into_its_ranks_with_raw_ids_and_call_identity(store, tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(export()))
    [result] = ingest_paths(store, [path], IngestOptions(work_dir=tmp_path))
    assert (result.num_ranks, result.num_events) == (2, 10)
    rows = store.execute("""SELECT rank, kind, name, pid, tid, ts_ns, dur_ns, correlation, CAST(args AS VARCHAR)
                            FROM events ORDER BY rank, ts_ns, kind""").fetchall()
    assert rows[:5] == [
        (0, "user_annotation", "ProfilerStep#4", "100", "100", BASE_NS + 1, 1_000_000, None, '{"External id":1}'),
        (0, "flow_start", "fwdbwd", "100", "100", BASE_NS + 10_000, 0, 17, None),
        (0, "cpu_op", "c10d::allreduce_", "100", "100", BASE_NS + 100_500, 40_250, None, '{"External id":2}'),
        (0, "user_annotation", "gloo:all_reduce", "100", "gloo worker", BASE_NS + 120_000, 300_000, None,
         '{"External id":3}'),
        (0, "flow_end", "fwdbwd", "100", "gloo worker", BASE_NS + 130_000, 0, 17, None),
    ]
    assert store.execute("""SELECT rank, op, pg_name, pg_desc, pg_ranks, seq, in_bytes, device_ts_ns FROM collectives
                            ORDER BY rank""").fetchall() == [
        (0, "all_reduce", "3", "DATA_PARALLEL_GROUP", [0, 1], 7, 4000, BASE_NS + 120_000),
        (1, "all_reduce", "3", "DATA_PARALLEL_GROUP", [0, 1], 7, 4000, BASE_NS + 120_000)]
    assert store.execute("SELECT rank, host, pid, trace_path FROM ranks ORDER BY rank").fetchall() == [
        (0, "h0", 100, str(path)), (1, "h1", 101, str(path))]
    assert store.execute("SELECT world_size, missing_ranks, model_flops_per_step FROM runs").fetchone() == (2, [], 1e9)
    again = ingest_paths(store, [path], IngestOptions(work_dir=tmp_path))
    assert not again[0].created


@pytest.mark.parametrize("change, message", [
    (lambda t: t["bprofExport"].update(format="other"), "bprofExport is not a bprof-perfetto header"),
    (lambda t: t["bprofExport"]["ranks"].pop(), "a thread bprofExport does not list"),
    (lambda t: t["traceEvents"].append({"ph": "X", "name": "x", "pid": 0, "tid": 131072, "ts": 1.0, "dur": 1.0}),
     "a thread bprofExport does not list"),
    (lambda t: t["bprofExport"]["ranks"].append({"rank": 5, "threads": []}), "lists rank 5, but the file has no events"),
    (lambda t: t["traceEvents"][1]["args"]["bprof.collective"].update(pg_ranks=["a"]), "malformed pg_ranks"),
])
def test_a_malformed_export_is_bad_data(store, tmp_path, change, message):
    trace = export()
    change(trace)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(trace))
    with pytest.raises(DataError, match=message) as err:
        ingest_paths(store, [path], IngestOptions(work_dir=tmp_path))
    assert str(path) in str(err.value)
    assert store.execute("SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM events)").fetchone() == (0, 0)
