"""Layouts, idempotence, mixed time bases and inconsistent runs, on tiny exact traces."""

from __future__ import annotations

from bprof.store.ingest import ingest_paths
from tests.store.tiny_traces import BASE_NS, absolute_trace, modern_trace, write


def test_directory_of_ranks_gives_exact_rows(store, tmp_path):
    for rank in range(2):
        write(tmp_path / "run" / f"rank{rank}.json.gz", modern_trace(rank))
    [r] = ingest_paths(store, [tmp_path / "run"])
    assert (r.num_ranks, r.created, r.warnings) == (2, True, [])
    assert store.execute("SELECT rank, step, ts_ns, dur_ns FROM steps WHERE run_id = ? ORDER BY rank, step",
                         [r.run_id]).fetchall() == [
        (0, 2, BASE_NS + 5110314061641296, 1_000_000), (0, 3, BASE_NS + 5110314062646296, 1_000_000),
        (1, 2, BASE_NS + 5110314061641296, 1_000_000), (1, 3, BASE_NS + 5110314062646296, 1_000_000)]
    # one all_reduce per step per rank, its work is the gloo worker range matched in order
    rows = store.execute("""SELECT rank, call_index, op, source, dtype, in_elems, in_bytes, pg_desc, pg_ranks,
                                   cpu_dur_ns, device_dur_ns, num_kernels, step
                            FROM collectives WHERE run_id = ? ORDER BY rank, call_index""", [r.run_id]).fetchall()
    assert rows == [(rank, i, "all_reduce", "c10d", "float", 1000, 4000, "default_pg", [0, 1], 40_250, 300_000, 1, step)
                    for rank in range(2) for i, step in enumerate((2, 3))]
    # aten::mm inside step 2 of rank 0
    assert store.execute("SELECT step FROM events WHERE run_id = ? AND rank = 0 AND name = 'aten::mm' ORDER BY ts_ns",
                         [r.run_id]).fetchall() == [(2,), (3,)]


def test_same_files_twice_is_one_run(store, tmp_path):
    for rank in range(2):
        write(tmp_path / "run" / f"rank{rank}.json.gz", modern_trace(rank))
    [first] = ingest_paths(store, [tmp_path / "run"])
    events = store.execute("SELECT count(*) FROM events").fetchone()[0]
    [again] = ingest_paths(store, [tmp_path / "run"])
    assert (again.run_id, again.created) == (first.run_id, False)
    assert store.execute("SELECT count(*) FROM events").fetchone()[0] == events
    assert store.execute("SELECT count(*) FROM runs").fetchone()[0] == 1


def test_pretty_printed_and_plain_json(store, tmp_path):
    write(tmp_path / "run" / "rank0.json", modern_trace(0), pretty=True)
    write(tmp_path / "run" / "rank1.json", modern_trace(1))
    [r] = ingest_paths(store, [tmp_path / "run"])
    assert store.execute("SELECT count(*) FROM events WHERE run_id = ? GROUP BY rank ORDER BY rank",
                         [r.run_id]).fetchall() == [(9,), (9,)]


def test_mixed_time_bases_in_one_run_align(store, tmp_path):
    """Rank 0 relative to baseTimeNanoseconds, rank 1 absolute us: same instants, no overflow."""
    write(tmp_path / "run" / "rank0.json.gz", modern_trace(0))
    write(tmp_path / "run" / "rank1.json.gz", absolute_trace(1))
    [r] = ingest_paths(store, [tmp_path / "run"])
    bases = store.execute("SELECT rank, time_base FROM ranks WHERE run_id = ? ORDER BY rank", [r.run_id]).fetchall()
    assert bases == [(0, "relative_base"), (1, "absolute_us")]
    starts = store.execute("SELECT rank, ts_ns FROM steps WHERE run_id = ? AND step = 2 ORDER BY rank",
                           [r.run_id]).fetchall()
    # the absolute trace was rounded to whole us when written
    assert abs(starts[0][1] - starts[1][1]) < 1_000
    assert r.warnings == []


def test_torchtitan_layout_is_one_run_per_iteration(store, tmp_path):
    root = tmp_path / "profiling" / "traces"
    for it, steps in ((10, (10,)), (20, (20,))):
        for rank in range(2):
            write(root / f"iteration_{it}" / f"rank{rank}_trace.json.gz", modern_trace(rank, steps=steps))
    results = ingest_paths(store, [root])
    assert [(r.name, r.num_ranks) for r in results] == [("traces-iteration_10", 2), ("traces-iteration_20", 2)]


def test_files_of_different_jobs_are_flagged(store, tmp_path):
    write(tmp_path / "run" / "rank0.json.gz", modern_trace(0, world_size=2, steps=(2, 3)))
    write(tmp_path / "run" / "rank1.json.gz", modern_trace(1, world_size=4, steps=(7, 8)))
    [r] = ingest_paths(store, [tmp_path / "run"])
    consistent, why = store.execute("SELECT consistent, inconsistency FROM runs WHERE run_id = ?", [r.run_id]).fetchone()
    assert consistent is False
    assert why == "world sizes disagree ([2, 4]), step numbers disagree (rank 0: 2-3 (2); rank 1: 7-8 (2))"
    assert len(r.warnings) == 2 and "not measurable" in r.warnings[0] and r.warnings[1] == "2 of 4 ranks ingested (partial run; missing ranks 2-3)"


def test_run_names_are_unique(store, tmp_path):
    write(tmp_path / "a" / "run" / "rank0.json.gz", modern_trace(0, world_size=1))
    write(tmp_path / "b" / "run" / "rank0.json.gz", modern_trace(0, world_size=1, steps=(4,)))
    [a] = ingest_paths(store, [tmp_path / "a" / "run"])
    [b] = ingest_paths(store, [tmp_path / "b" / "run"])
    assert (a.name, b.name) == ("run", "run-2")


def test_a_trace_cut_into_parts_loses_and_reorders_nothing(store, tmp_path, monkeypatch):
    from bprof.store import kineto_file

    trace = modern_trace(0, world_size=1, steps=tuple(range(2, 60)))
    write(tmp_path / "whole" / "rank0.json", trace, pretty=True)
    write(tmp_path / "cut" / "rank0.json", trace, pretty=True)
    [whole] = ingest_paths(store, [tmp_path / "whole"])
    monkeypatch.setattr(kineto_file, "PART_BYTES", 2000)
    split = kineto_file.split_trace(tmp_path / "cut" / "rank0.json", tmp_path / "probe.json")
    assert len(split.array_paths) > 10
    [cut] = ingest_paths(store, [tmp_path / "cut"])
    query = "SELECT count(*), sum(ts_ns), sum(dur_ns), count(DISTINCT step), string_agg(name, ',' ORDER BY ts_ns, name) FROM events WHERE run_id = ?"
    assert store.execute(query, [cut.run_id]).fetchone() == store.execute(query, [whole.run_id]).fetchone()


def test_old_nccl_traces_take_the_reduction_dtype_from_the_kernel_name(store, tmp_path):
    """2022-era record_param_comms carry no args: a reduction kernel's name still names the type;
    a broadcast kernel's int8_t is NCCL moving bytes, not the tensor's type."""
    events = []
    for i, (op, kernel) in enumerate((("c10d::allreduce_", "ncclKernel_AllReduce_RING_LL_Sum_half(ncclWorkElem)"),
                                      ("c10d::broadcast_", "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclWorkElem)"))):
        t = 1_000_000 + i * 1000
        events += [
            {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": t, "dur": 50,
             "args": {"External id": 10 * i + 1, "Input Dims": [[[1000]], []], "Input type": ["TensorList", "Scalar"]}},
            {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": t + 5, "dur": 40,
             "args": {"External id": 10 * i + 2}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 10, "dur": 5,
             "args": {"External id": 10 * i + 2, "correlation": 100 + i}},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 13, "ts": t + 20, "dur": 300,
             "args": {"External id": 100 + i, "device": 0, "stream": 13, "correlation": 100 + i}},
        ]
    trace = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Tesla V100"}],
             "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1}, "traceEvents": events}
    write(tmp_path / "old" / "rank0.json", trace)
    [r] = ingest_paths(store, [tmp_path / "old"])
    rows = store.execute("SELECT op, dtype, in_elems, in_bytes, num_kernels, device_dur_ns FROM collectives "
                         "WHERE run_id = ? ORDER BY call_index", [r.run_id]).fetchall()
    assert rows == [("all_reduce", "half", 1000, 2000, 1, 300_000), ("broadcast", None, 1000, None, 1, 300_000)]
