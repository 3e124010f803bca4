"""The partition of a step on tiny hand-built timelines (exact), and on synthetic runs with planted truth."""

import pytest

from bprof.analyzers.base import Options
from bprof.analyzers import run as analysis
from tests.analyzers.tables import tiny_store

FRACS = ("compute_frac", "exposed_comm_frac", "overlapped_comm_frac", "memcpy_frac", "idle_frac", "other_frac")


@pytest.fixture(autouse=True)
def only_partition(monkeypatch):
    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "breakdown"])


def _steps(con, run_id):
    cur = con.execute("SELECT * EXCLUDE (run_id) FROM breakdown_steps WHERE run_id = ? ORDER BY rank, step", [run_id])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def test_gpu_partition_is_exact_and_sums_to_one(tmp_path):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 10, "dur_ns": 30, "step": 1},
        {"kind": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
         "ts_ns": 30, "dur_ns": 30, "step": 1, "stream": 20},
        {"kind": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts_ns": 70, "dur_ns": 10, "step": 1},
    ])
    analysis.analyze_run(con, run_id, Options())
    [row] = _steps(con, run_id)
    assert (row["timeline"], row["span_ns"]) == ("device", 100)
    assert (row["compute_ns"], row["overlapped_comm_ns"], row["exposed_comm_ns"], row["memcpy_ns"], row["idle_ns"],
            row["other_ns"]) == (20, 10, 20, 10, 40, 0)
    assert sum(row[f] for f in FRACS) == pytest.approx(1.0)
    assert row["comm_overlap_frac"] == pytest.approx(10 / 30)
    assert row["exposed_wait_ns"] is None  # not attributable before cross-rank alignment


def test_consecutive_steps_tile_and_the_last_waits_for_the_device(tmp_path):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 90), (0, 2, 100, 50)], events=[
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 95, "dur_ns": 10, "step": 1},  # runs into step 2's span
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 160, "dur_ns": 20, "step": 2},  # after step 2's CPU end
    ])
    analysis.analyze_run(con, run_id, Options())
    rows = _steps(con, run_id)
    assert [(r["step"], r["span_ns"], r["compute_ns"]) for r in rows] == [(1, 100, 5), (2, 80, 25)]
    for r in rows:
        assert sum(r[f] for f in FRACS) == pytest.approx(1.0)


def test_cpu_main_thread_partition_is_exact(tmp_path):
    main, worker = "1", "2"
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[
        {"kind": "cpu_op", "name": "aten::mm", "tid": main, "ts_ns": 10, "dur_ns": 20},
        {"kind": "user_annotation", "name": "gloo:all_reduce", "tid": worker, "ts_ns": 20, "dur_ns": 5},
        {"kind": "cpu_op", "name": "c10d::allreduce_", "tid": main, "ts_ns": 35, "dur_ns": 5},
        {"kind": "cpu_op", "name": "_ReduceFromTP", "tid": main, "ts_ns": 40, "dur_ns": 30},  # blocks in wait inside
        {"kind": "user_annotation", "name": "gloo:all_reduce", "tid": worker, "ts_ns": 45, "dur_ns": 20},
        {"kind": "user_annotation", "name": "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         "tid": main, "ts_ns": 80, "dur_ns": 10},
    ])
    analysis.analyze_run(con, run_id, Options())
    [row] = _steps(con, run_id)
    assert row["timeline"] == "main_thread"
    assert (row["compute_ns"], row["overlapped_comm_ns"], row["exposed_comm_ns"], row["memcpy_ns"], row["other_ns"],
            row["idle_ns"]) == (15, 5, 25, 0, 20, 35)
    assert sum(row[f] for f in FRACS) == pytest.approx(1.0)
    assert row["comm_overlap_frac"] == pytest.approx(5 / 30)


def test_rank_without_profiler_steps_is_one_whole_trace_span_and_says_so(tmp_path):
    con, run_id = tiny_store(tmp_path / "s.duckdb", events=[
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 1000, "dur_ns": 10},
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 1030, "dur_ns": 10},
    ])
    analysis.analyze_run(con, run_id, Options())
    [row] = _steps(con, run_id)
    assert (row["step"], row["span_ns"], row["compute_ns"], row["idle_ns"]) == (-1, 40, 20, 20)
    [(severity,)] = con.execute("SELECT severity FROM findings WHERE run_id = ? AND analyzer = 'timeline'", [run_id]).fetchall()
    assert severity == "not_measurable"


def test_rerunning_replaces_rows(tmp_path):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 10, "dur_ns": 30, "step": 1}])
    analysis.analyze_run(con, run_id, Options())
    analysis.analyze_run(con, run_id, Options())
    assert con.execute("SELECT count(*) FROM breakdown_steps WHERE run_id = ?", [run_id]).fetchone()[0] == 1


BACKWARD_OP = {"kind": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0", "ts_ns": 50, "dur_ns": 10}


def test_parallel_dimensions_from_descriptions_and_layout(tmp_path):
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=4, steps=[(r, 1, 0, 100) for r in range(4)],
                             events=[BACKWARD_OP])  # a training run: data parallelism is possible
    rows = [  # (rank, pg_name, pg_desc, pg_ranks, is_p2p)
        (0, "1", "TENSOR_MODEL_PARALLEL_GROUP", [0, 1], False),
        (0, "2", None, [0, 2], False),       # strided subgroup: data parallel by layout
        (0, "3", None, [0, 1], False),       # consecutive: tensor parallel by layout
        (0, "4", None, [0, 3], True),        # only send/recv: pipeline
        (0, "0", "default_pg", [0, 1, 2, 3], False),
    ]
    for i, (rank, name, desc, ranks, p2p) in enumerate(rows):
        con.execute("""INSERT INTO collectives (run_id, rank, call_index, op, raw_name, source, is_p2p, pg_name, pg_desc,
                       pg_ranks, group_size, num_parts, cpu_ts_ns, cpu_dur_ns, num_kernels)
                       VALUES (?, ?, ?, 'all_reduce', 'x', 'c10d', ?, ?, ?, ?, ?, 1, ?, 5, 0)""",
                    [run_id, rank, i, p2p, name, desc, ranks, len(ranks), 10 + 10 * i])
    analysis.analyze_run(con, run_id, Options())
    got = dict(con.execute("SELECT pg_name, dim || '/' || dim_source FROM breakdown_groups WHERE run_id = ?", [run_id]).fetchall())
    assert got == {"1": "tp/pg_desc", "2": "dp/layout", "3": "tp/layout", "4": "pp/p2p", "0": "world/layout"}
    dims = dict(con.execute("SELECT dim, comm_ns FROM breakdown_dims WHERE run_id = ? AND rank = 0", [run_id]).fetchall())
    assert dims == {"tp": 10, "dp": 5, "pp": 5, "world": 5}


def _collective(con, run_id, rank, i, *, name, desc, ranks, p2p=False, cpu=(0, 1), device=None, op="all_reduce"):
    con.execute("""INSERT INTO collectives (run_id, rank, call_index, op, raw_name, source, is_p2p, pg_name, pg_desc,
                   pg_ranks, group_size, num_parts, cpu_ts_ns, cpu_dur_ns, device_ts_ns, device_dur_ns, num_kernels)
                   VALUES (?, ?, ?, ?, 'x', 'c10d', ?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?)""",
                [run_id, rank, i, op, p2p, name, desc, ranks, len(ranks), *cpu, *(device or (None, None)),
                 0 if device is None else 1])


@pytest.mark.parametrize("training, want", [
    (False, {"0": "unknown/none", "1": "tp/layout", "2": "unknown/none"}),
    (True, {"0": "dp/layout", "1": "tp/layout", "2": "dp/layout"}),
])
def test_b200_vllm_tp8_group_is_not_dp(tmp_path, training, want):
    """B200 vLLM TP=8: the one group is the whole world, no description, all-reduces inside every
    layer's forward; bprof called it DP because every call was on a whole-world group. Without a
    backward there are no gradients to synchronise: no group is data parallel by its layout."""
    events = [{"kind": "cpu_op", "name": "aten::linear", "ts_ns": 10, "dur_ns": 10}] + ([BACKWARD_OP] if training else [])
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=8, steps=[(r, 1, 0, 100) for r in range(8)], events=events)
    _collective(con, run_id, 0, 0, name="0", desc=None, ranks=list(range(8)), cpu=(20, 5))
    analysis.analyze_run(con, run_id, Options())
    got = dict(con.execute("SELECT pg_name, dim || '/' || dim_source FROM breakdown_groups WHERE run_id = ?",
                           [run_id]).fetchall())
    assert got == {"0": want["0"]}
    # subgroups of the same run: consecutive ranks are still tp, a strided one dp only when training
    con.execute("DELETE FROM collectives WHERE run_id = ?", [run_id])
    _collective(con, run_id, 0, 0, name="1", desc=None, ranks=[0, 1, 2, 3], cpu=(20, 5))
    _collective(con, run_id, 0, 1, name="2", desc=None, ranks=[0, 4], cpu=(30, 5))
    analysis.analyze_run(con, run_id, Options())
    got = dict(con.execute("SELECT pg_name, dim || '/' || dim_source FROM breakdown_groups WHERE run_id = ?",
                           [run_id]).fetchall())
    assert got == {"1": want["1"], "2": want["2"]}


SYMM_MEM_KERNEL = "void (anonymous namespace)::two_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(...)"
DEEP_EP_KERNEL = ("void deep_ep::internode_ll::combine<3, 10, 7168, 9>(void*, void*, int*, void*, void const*, long const*, "
                  "float const*, int const*, long const*, int*, int, int*, int, int, int, int, int, int, int, int, bool)")


def test_b200_vllm_symmetric_memory_time_reaches_the_exposed_communication_finding(tmp_path):
    """B200 vLLM: 2.14 ms of exposed symmetric-memory time was communication in the partition but in
    no finding: its kernels go through no c10d call, so no collectives row, so no dimension. Such
    kernels are calls of their own: DeepEP's of ep, symmetric memory's of an unknown group. A
    kernel inside a c10d call's device time is that call's, counted once."""
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 0, "dur_ns": 40, "step": 1},
        {"kind": "kernel", "name": SYMM_MEM_KERNEL, "ts_ns": 40, "dur_ns": 30, "step": 1, "stream": 20},
        {"kind": "kernel", "name": DEEP_EP_KERNEL, "ts_ns": 75, "dur_ns": 15, "step": 1, "stream": 21},
        {"kind": "kernel", "name": SYMM_MEM_KERNEL, "ts_ns": 92, "dur_ns": 4, "step": 1, "stream": 20},
    ])
    _collective(con, run_id, 0, 0, name="1", desc="TENSOR_MODEL_PARALLEL_GROUP", ranks=[0, 1], cpu=(91, 1), device=(92, 6))
    analysis.analyze_run(con, run_id, Options())
    [row] = _steps(con, run_id)
    assert (row["compute_ns"], row["exposed_comm_ns"], row["idle_ns"]) == (40, 30 + 15 + 4, 5 + 2 + 4)
    dims = {d: (c, e) for d, c, e in con.execute(
        "SELECT dim, comm_ns, exposed_comm_ns FROM breakdown_dims WHERE run_id = ?", [run_id]).fetchall()}
    # tp: the call's CPU time and device time (91-98), exposed where its kernel ran (92-96)
    assert dims == {"unknown": (30, 30), "ep": (15, 15), "tp": (7, 4)}
    found = {dim: lost for dim, lost in con.execute(
        """SELECT evidence->>'$.dim', lost_ns FROM findings WHERE run_id = ? AND analyzer = 'breakdown'
           AND title LIKE 'Exposed%communication%'""", [run_id]).fetchall()}
    assert found == {"unknown": 30, "ep": 15, "tp": 4}


@pytest.fixture(scope="module")
def synth_run(tmp_path_factory):
    """A synthetic tp2 x pp2 x dp2 GPU run (modern format, 2 hosts, skewed clocks) and its truth."""
    from bprof.store.db import open_store
    from bprof.store.ingest import IngestOptions, ingest_paths
    from bprof.synth import Scenario, write_run

    out = tmp_path_factory.mktemp("synth")
    truth = write_run(Scenario(tp=2, pp=2, dp=2, steps=3, hosts=2, clock_offset_ns={0: 0, 1: 350_000}, seed=3), out / "run")
    con = open_store(out / "s.duckdb")
    [result] = ingest_paths(con, [out / "run"], IngestOptions(name="synth"))
    run_id = result.run_id
    return con, run_id, truth


def test_synthetic_compute_time_matches_planted_kernels(synth_run, monkeypatch):
    con, run_id, truth = synth_run
    analysis.analyze_run(con, run_id, Options())
    got = {(r, s): c for r, s, c in con.execute(
        "SELECT rank, step, compute_ns + overlapped_comm_ns FROM breakdown_steps WHERE run_id = ?", [run_id]).fetchall()}
    assert len(got) == truth["world_size"] * 3
    for r in truth["ranks"]:
        for step, planted in zip(r["steps"], r["step_compute_kernel_ns"]):
            # spans cut by time, truth counts by launch: kernels straddling a step edge move by a little
            assert got[(r["rank"], step)] == pytest.approx(planted, rel=0.02), (r["rank"], step)
    for row in _steps(con, run_id):
        assert sum(row[f] for f in FRACS) == pytest.approx(1.0)


def test_cpu_gc_pause_is_idle_and_attributed_to_gc(tmp_path, monkeypatch):
    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "breakdown", "idle"])
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[
        {"kind": "cpu_op", "name": "aten::mm", "ts_ns": 10, "dur_ns": 20},
        {"kind": "user_annotation", "name": "bprof/gc.gen2", "ts_ns": 40, "dur_ns": 30},
    ])
    analysis.analyze_run(con, run_id, Options())
    [row] = _steps(con, run_id)
    assert (row["compute_ns"], row["idle_ns"], row["other_ns"]) == (20, 80, 0)
    causes = dict(con.execute("SELECT cause, dur_ns FROM idle_causes WHERE run_id = ?", [run_id]).fetchall())
    assert causes["gc"] == 30 and causes["host_other"] == 50


def test_exposed_communication_findings_leave_the_wait_for_a_straggler_out(tmp_path, monkeypatch):
    """A planted slow rank makes its peers wait inside their collectives. Overlapping communication
    with compute does not remove that wait, so once cross-rank analysis has split exposed time into
    waiting and transfer, an exposed-communication finding prices at most the transfer."""
    from bprof.store.db import open_store
    from bprof.store.ingest import IngestOptions, ingest_paths
    from bprof.synth import Fault, Scenario, write_run

    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "match", "clock", "collperf", "breakdown"])
    write_run(Scenario(tp=2, pp=1, dp=2, steps=3, hosts=1, seed=3,
                       faults=[Fault("slow_rank", rank=3, extra_ns=20_000_000)]), tmp_path / "run")
    con = open_store(tmp_path / "s.duckdb")
    [r] = ingest_paths(con, [tmp_path / "run"], IngestOptions(name="slow"))
    analysis.analyze_run(con, r.run_id, Options())
    waited = con.execute("SELECT max(exposed_wait_ns) FROM breakdown_steps WHERE run_id = ?", [r.run_id]).fetchone()[0]
    assert waited > 15_000_000  # the peers of rank 3 wait for most of its 20 ms
    found = con.execute("""SELECT lost_ns, evidence->>'$.dim', CAST(evidence->>'$.ranks[0]' AS INTEGER) FROM findings
                           WHERE run_id = ? AND analyzer = 'breakdown' AND title LIKE 'Exposed%'""", [r.run_id]).fetchall()
    assert found
    left_out = []
    for lost_ns, dim, rank in found:
        exposed, transfer = con.execute("""
            SELECT median(d.exposed_comm_ns), median(least(d.exposed_comm_ns, s.exposed_transfer_ns))
            FROM breakdown_dims d JOIN breakdown_steps s USING (run_id, rank, step)
            WHERE d.run_id = ? AND d.rank = ? AND d.dim = ?""", [r.run_id, rank, dim]).fetchone()
        # the engine prices it (free-comm:DIM): never above the measured transfer, never the wait
        assert 0 <= lost_ns <= int(transfer) <= exposed, (dim, rank, lost_ns, transfer, exposed)
        left_out.append(exposed - lost_ns)
    assert max(left_out) > 5_000_000, found  # the wait is not priced as overlappable communication


def test_megatron_embedding_group_is_not_data_parallel(tmp_path):
    """Megatron's EMBEDDING_GROUP joins the first and last pipeline stages (ranks 0 and 3 of a pp4
    job) to all-reduce the tied embeddings' gradients; its single stride made it data parallel."""
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=4, steps=[(r, 1, 0, 100) for r in range(4)],
                             events=[BACKWARD_OP])
    _collective(con, run_id, 0, 0, name="7", desc="EMBEDDING_GROUP", ranks=[0, 3], cpu=(20, 5))
    _collective(con, run_id, 0, 1, name="8", desc="POSITION_EMBEDDING_GROUP", ranks=[0, 3], cpu=(40, 5))
    _collective(con, run_id, 0, 2, name="9", desc=None, ranks=[0, 2], cpu=(60, 5))
    analysis.analyze_run(con, run_id, Options())
    got = dict(con.execute("SELECT pg_name, dim || '/' || dim_source FROM breakdown_groups WHERE run_id = ?", [run_id]).fetchall())
    assert got == {"7": "embedding/pg_desc", "8": "embedding/pg_desc", "9": "dp/layout"}


def test_exposed_communication_is_priced_by_the_engine_as_its_what_if(tmp_path, monkeypatch):
    """One engine, one answer: an exposed-communication finding's lost_ns is what `bprof whatif -s
    free-comm:DIM` saves (capped by the measured exposed transfer)."""
    from bprof.store.db import open_store
    from bprof.store.ingest import IngestOptions, ingest_paths
    from bprof.synth import Scenario, write_run
    from bprof.whatif.run import whatif

    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "match", "clock", "collperf", "breakdown"])
    write_run(Scenario(tp=2, pp=1, dp=2, steps=3, hosts=1, seed=5), tmp_path / "run")
    con = open_store(tmp_path / "s.duckdb")
    [r] = ingest_paths(con, [tmp_path / "run"], IngestOptions(name="plain"))
    analysis.analyze_run(con, r.run_id, Options())
    found = con.execute("""SELECT lost_ns, evidence->>'$.dim', CAST(evidence->>'$.exposed_recoverable_ns' AS BIGINT)
                           FROM findings WHERE run_id = ? AND analyzer = 'breakdown' AND title LIKE 'Exposed%'""",
                        [r.run_id]).fetchall()
    assert {dim for _, dim, _ in found} >= {"tp", "dp"}
    for lost_ns, dim, measured in found:
        saved = whatif(con, r.run_id, [f"free-comm:{dim}"], write=False).summaries[1]["saved_ns"]
        assert lost_ns == max(min(saved, measured), 0), (dim, lost_ns, saved, measured)
