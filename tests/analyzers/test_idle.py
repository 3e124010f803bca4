"""Idle attribution: exact on tiny hand-built timelines, against the planted data stall and syncs of
a synthetic GPU run, on the real GPU traces of ../shared/traces and on a real torchrun recording."""

import json

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from tests.analyzers import recorded
from tests.analyzers.tables import tiny_store

GEMM = "ampere_sgemm_128x64_nn"


@pytest.fixture
def only_idle(monkeypatch):
    # match: the idle findings are priced by the what-if engine, which replays the matched step graph
    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "match", "breakdown", "idle"])


def _causes(con, run_id, step=1, rank=0):
    return {c: (ns, n) for c, ns, n in con.execute(
        "SELECT cause, dur_ns, num_gaps FROM idle_causes WHERE run_id = ? AND rank = ? AND step = ?",
        [run_id, rank, step]).fetchall()}


def _kernel(ts, dur, **extra):
    return {"kind": "kernel", "name": GEMM, "ts_ns": ts, "dur_ns": dur, **extra}


def _host(name, ts, dur, kind="cpu_op", tid="1", **extra):
    return {"kind": kind, "name": name, "tid": tid, "ts_ns": ts, "dur_ns": dur, **extra}


def test_gpu_gaps_are_attributed_exactly(tmp_path, only_idle):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 1000)], events=[
        _kernel(0, 100), _kernel(300, 100), _kernel(600, 50), _kernel(900, 100),
        # gap 100-300 starts inside a sync: sync-caused, except the gc pause in it
        _host("cudaStreamSynchronize", 50, 70, kind="cuda_runtime"),
        _host("bprof/gc.gen2", 150, 30, kind="user_annotation"),
        _host("aten::add", 200, 50),
        # gap 400-600: data loading, then an op launching a kernel, Python around it
        _host("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 400, 100, kind="user_annotation"),
        _host("aten::mm", 520, 40),
        _host("cudaLaunchKernel", 540, 10, kind="cuda_runtime", correlation=9),
        # gap 650-900: Python; an op on a thread that is neither main nor autograd does not count
        _host("aten::copy_", 700, 100, tid="9"),
    ])
    analysis.analyze_run(con, run_id, Options())
    assert _causes(con, run_id) == {"sync": (170, 1), "gc": (30, 1), "data_loading": (100, 1),
                                    "launch_bound": (40, 1), "host_other": (60 + 250, 2)}
    idle_ns = con.execute("SELECT idle_ns FROM breakdown_steps WHERE run_id = ?", [run_id]).fetchone()[0]
    assert sum(ns for ns, _ in _causes(con, run_id).values()) == idle_ns == 650
    gaps = con.execute("SELECT ts_ns, dur_ns, sync_caused, main_cause, main_cause_ns FROM idle_gaps WHERE run_id = ? ORDER BY ts_ns",
                       [run_id]).fetchall()
    assert gaps == [(100, 200, True, "sync", 170), (400, 200, False, "data_loading", 100), (650, 250, False, "host_other", 250)]
    ops = con.execute("SELECT cause, name, dur_ns, num_gaps FROM idle_ops WHERE run_id = ? ORDER BY cause", [run_id]).fetchall()
    assert ops == [("launch_bound", "aten::mm", 40, 1), ("sync", "aten::add", 50, 1)]
    found = dict(con.execute("SELECT evidence->>'$.cause', lost_ns FROM findings WHERE run_id = ? AND analyzer = 'idle'",
                             [run_id]).fetchall())
    # data loading is the phases analyzer's finding (with its noise rule), not a second one here
    assert found == {"sync": 170, "gc": 30, "launch_bound": 40, "host_other": 310}


def test_a_sync_caused_gap_cut_by_a_step_boundary_stays_sync_caused(tmp_path, only_idle):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 500), (0, 2, 500, 500)], events=[
        _kernel(0, 400), _host("aten::item", 350, 70), _kernel(700, 100),
    ])
    analysis.analyze_run(con, run_id, Options())
    assert _causes(con, run_id, step=1) == {"sync": (100, 1)}
    assert _causes(con, run_id, step=2) == {"sync": (200, 1), "host_other": (200, 1)}


def test_cpu_trace_idle_is_python_between_ops(tmp_path, only_idle):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100), (0, 2, 100, 100)], events=[
        _host("aten::mm", 10, 20), _host("aten::add", 50, 10),
        _host("aten::mm", 100, 90),
    ])
    analysis.analyze_run(con, run_id, Options())
    assert _causes(con, run_id, step=1) == {"host_other": (70, 3)}
    assert _causes(con, run_id, step=2) == {"host_other": (10, 1)}
    [(title, lost_ns)] = con.execute("SELECT title, lost_ns FROM findings WHERE run_id = ? AND analyzer = 'idle'",
                                     [run_id]).fetchall()
    assert title.startswith("Training thread in Python between ops") and lost_ns == 40  # median of 70 and 10


def test_synthetic_stall_and_syncs(tmp_path, monkeypatch):
    from bprof.store.db import open_store
    from bprof.store.ingest import IngestOptions, ingest_paths
    from bprof.synth import Fault, Scenario, write_run

    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "breakdown", "phases", "idle"])
    extra_ns = 20_000_000
    write_run(Scenario(tp=2, pp=1, dp=2, steps=3, layers=2, microbatches=2, seed=1,
                       faults=[Fault("stalled_input", rank=1, extra_ns=extra_ns)]), tmp_path / "run")
    con = open_store(tmp_path / "s.duckdb")
    [result] = ingest_paths(con, [tmp_path / "run"], IngestOptions(name="synth"))
    run_id = result.run_id
    analysis.analyze_run(con, run_id, Options())
    loading = dict(((r, s), ns) for r, s, ns in con.execute(
        "SELECT rank, step, dur_ns FROM idle_causes WHERE run_id = ? AND cause = 'data_loading'", [run_id]).fetchall())
    exposed = dict(((r, s), ns) for r, s, ns in con.execute(
        "SELECT rank, step, device_idle_ns FROM phases_steps WHERE run_id = ? AND phase = 'data_wait'", [run_id]).fetchall())
    assert loading == exposed and len(loading) == 12  # two analyzers, one definition of exposed data loading
    assert all(extra_ns < ns < extra_ns + 700_000 for (r, _), ns in loading.items() if r == 1)
    assert all(ns < 700_000 for (r, _), ns in loading.items() if r != 1)
    # every step ends in aten::item (cudaStreamSynchronize): the gap after it is sync-caused on every rank
    assert con.execute("SELECT count(DISTINCT rank) FROM idle_gaps WHERE run_id = ? AND sync_caused", [run_id]).fetchone()[0] == 4
    assert con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND analyzer = 'idle' AND evidence->>'$.cause' = 'data_loading'",
                       [run_id]).fetchone()[0] == 0


def _sum_matches_breakdown(con, run_id):
    bad = con.execute("""
        SELECT b.rank, b.step, b.idle_ns, coalesce(sum(c.dur_ns), 0) AS attributed
        FROM breakdown_steps b LEFT JOIN idle_causes c USING (run_id, rank, step)
        WHERE b.run_id = ? GROUP BY ALL HAVING b.idle_ns <> coalesce(sum(c.dur_ns), 0)""", [run_id]).fetchall()
    assert bad == []


@pytest.mark.parametrize("folder", ["a100_ddp_nccl_rank0", "a100_ws16_rank0", "mi250_rocm_minitoy",
                                    "v100_ns_resolution_rank0", "v100_resnet50_legacy_2021"])
def test_real_gpu_traces_attribute_all_idle_time(tmp_path, folder):
    con, run_id = recorded.shared(tmp_path, folder, ["idle"])
    _sum_matches_breakdown(con, run_id)
    assert con.execute("SELECT count(*) FROM idle_causes WHERE run_id = ?", [run_id]).fetchone()[0] > 0


def test_real_resnet_sample_without_loader_workers_idles_in_data_loading(tmp_path):
    # kineto's tb_plugin sample: ResNet-50 with DataLoader(num_workers=0), loading on the training thread
    con, run_id = recorded.shared(tmp_path, "v100_resnet50_legacy_2021", ["idle"])
    rows = con.execute("""SELECT step, arg_max(cause, dur_ns), max(dur_ns), sum(dur_ns) FROM idle_causes
                          WHERE run_id = ? GROUP BY step""", [run_id]).fetchall()
    assert len(rows) == 6
    for step, cause, top_ns, total_ns in rows:
        assert cause == "data_loading" and top_ns > 0.6 * total_ns, step


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("idle_real")
    return recorded.analysed(recorded.record_train_gpt(out, "plain", ["--microbatches", "2"], steps="3:5"), None)


@pytest.mark.slow
def test_real_cpu_run_idle_is_python_and_all_of_it_is_attributed(real_run):
    con, run_id = real_run
    _sum_matches_breakdown(con, run_id)
    assert {c for (c,) in con.execute("SELECT DISTINCT cause FROM idle_causes WHERE run_id = ?", [run_id]).fetchall()} == {"host_other"}
    [(lost_ns, evidence)] = con.execute("SELECT lost_ns, evidence FROM findings WHERE run_id = ? AND analyzer = 'idle'",
                                        [run_id]).fetchall()
    rank = json.loads(evidence)["ranks"][0]
    medians = dict(con.execute("SELECT rank, median(dur_ns) FROM idle_causes WHERE run_id = ? GROUP BY rank", [run_id]).fetchall())
    assert json.loads(evidence)["idle_ns"] == int(medians[rank]) == int(max(medians.values()))
    # the price is the engine's: that idle removed on both ranks, the job's step gets shorter by
    # about the idle of the rank that bounds it, more where the ranks wait for each other (seen: 1.30
    # against 1.08 and 1.14 ms) - never by more than the two ranks' idle together
    assert 0 < lost_ns <= sum(medians.values())
    # and it is what `bprof whatif -s no-host-gaps:host_other` says: one engine, one answer
    from bprof.whatif.run import whatif
    assert whatif(con, run_id, ["no-host-gaps:host_other"], write=False).summaries[1]["saved_ns"] == lost_ns
