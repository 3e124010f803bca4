"""Memory per step: exact on tiny hand-built [memory] events (modern and 2021 formats), ranks out of
line with their peers, the real 2021 GPU trace that has memory events, and a real torchrun
recording made with `bprof record --memory`."""

import json

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from tests.analyzers import recorded
from tests.analyzers.tables import tiny_store

MIB = 1 << 20


@pytest.fixture
def only_memory(monkeypatch):
    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "breakdown", "memory"])


def _mem(ts, nbytes, total=None, device_type=0, device_id=-1, reserved=None, rank=0):
    args = {"Device Type": device_type, "Device Id": device_id, "Bytes": nbytes}
    if total is not None:
        args.update({"Total Allocated": total, "Total Reserved": reserved if reserved is not None else 0})
    return {"kind": "instant", "name": "[memory]", "ts_ns": ts, "dur_ns": 0, "args": args, "rank": rank}


def _op(name, ts, dur):
    return {"kind": "cpu_op", "name": name, "ts_ns": ts, "dur_ns": dur}


def _steps(con, run_id):
    return con.execute("SELECT * EXCLUDE (run_id, rank) FROM memory_steps WHERE run_id = ? ORDER BY step, device",
                       [run_id]).fetchall()


def test_levels_peaks_and_allocating_ops_are_exact(tmp_path, only_memory):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100), (0, 2, 100, 100)], events=[
        _op("aten::linear", 10, 30), _op("aten::empty", 12, 2), _op("aten::relu", 50, 10), _op("aten::linear", 110, 30),
        _mem(5, 100, 1100),          # outside any op
        _mem(12, 400, 1500),         # inside aten::empty, inside the top-level aten::linear
        _mem(20, 1000, 5000, device_type=1, device_id=0, reserved=8000),
        _mem(30, -100, 1400),
        _mem(55, 200, 1600),
        _mem(70, -600, 1000),
        _mem(112, 800, 1800),
        _mem(150, -800, 1000),
    ])
    analysis.analyze_run(con, run_id, Options())
    # step, device, peak, start, end, peak reserved, allocs, allocated bytes, baseline
    assert _steps(con, run_id) == [
        (1, "cpu", 1600, 1000, 1000, 0, 3, 700, "absolute"),
        (1, "cuda:0", 5000, 4000, 5000, 8000, 1, 1000, "absolute"),
        (2, "cpu", 1800, 1000, 1000, 0, 1, 800, "absolute"),
    ]
    ops = con.execute("SELECT device, name, num_allocs, alloc_bytes, max_alloc_bytes FROM memory_top_ops WHERE run_id = ? "
                      "ORDER BY device, alloc_bytes DESC", [run_id]).fetchall()
    assert ops == [("cpu", "aten::linear", 2, 1200, 800), ("cpu", "aten::relu", 1, 200, 200),
                   ("cpu", "(outside any op)", 1, 100, 100), ("cuda:0", "aten::linear", 1, 1000, 1000)]
    assert con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND analyzer = 'memory'", [run_id]).fetchone()[0] == 0


def test_traces_without_totals_count_from_the_trace_start(tmp_path, only_memory):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[
        _mem(10, 100, device_type=1, device_id=0), _mem(20, 50, device_type=1, device_id=0),
        _mem(30, -100, device_type=1, device_id=0)])
    analysis.analyze_run(con, run_id, Options())
    assert _steps(con, run_id) == [(1, "cuda:0", 150, 0, 50, None, 2, 150, "trace_start")]


def _ranks_at(tmp_path, peaks_mib, pipeline_groups=()):
    events = [_mem(10, p * MIB, p * MIB, device_type=1, device_id=0, rank=r) for r, p in enumerate(peaks_mib)]
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=len(peaks_mib), events=events,
                             steps=[(r, 1, 0, 100) for r in range(len(peaks_mib))])
    for i, ranks in enumerate(pipeline_groups):  # send/recv-only groups: breakdown calls them pipeline (pp)
        con.execute("""INSERT INTO collectives (run_id, rank, call_index, op, raw_name, source, is_p2p, pg_name, pg_ranks,
                       group_size, num_parts, cpu_ts_ns, cpu_dur_ns, num_kernels)
                       VALUES (?, ?, 0, 'send', 'x', 'c10d', true, ?, ?, ?, 1, 20, 5, 0)""",
                    [run_id, ranks[0], f"pp{i}", ranks, len(ranks)])
    return con, run_id


def test_a_rank_above_its_peers_is_a_finding(tmp_path, only_memory):
    con, run_id = _ranks_at(tmp_path, [1000, 1010, 1300, 990])
    analysis.analyze_run(con, run_id, Options())
    [(severity, lost_ns, title, evidence)] = con.execute(
        "SELECT severity, lost_ns, title, evidence FROM findings WHERE run_id = ? AND analyzer = 'memory'", [run_id]).fetchall()
    evidence = json.loads(evidence)
    assert (severity, lost_ns, evidence["ranks"], evidence["peer_ranks"]) == ("warning", None, [2], [0, 1, 3])
    assert evidence["peer_median_bytes"] == 1000 * MIB and title.startswith("Rank 2 holds 1300.0 MiB")


def test_a_rank_high_in_one_step_only_is_no_finding(tmp_path, only_memory):
    # rank 2 peaks 30% above its peers in step 1 (a contended step keeps buffers alive longer), not in step 2
    steps = [(r, s, 100 * s, 100) for r in range(4) for s in (1, 2)]
    peaks = {(2, 1): 1300}
    events = [_mem(100 * s + 10, p * MIB, p * MIB, device_type=1, device_id=0, rank=r)
              for r, s, _, _ in steps for p in [peaks.get((r, s), 1000)]]
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=4, events=events, steps=steps)
    analysis.analyze_run(con, run_id, Options())
    assert con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND analyzer = 'memory'", [run_id]).fetchone()[0] == 0


def test_pipeline_stages_are_compared_within_their_stage(tmp_path, only_memory):
    # stage 0 (ranks 0, 1) keeps more micro-batches of activations than stage 1 (ranks 2, 3): no finding
    con, run_id = _ranks_at(tmp_path, [1300, 1300, 1000, 1000], pipeline_groups=[[0, 2], [1, 3]])
    analysis.analyze_run(con, run_id, Options())
    assert con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND analyzer = 'memory'", [run_id]).fetchone()[0] == 0


def test_without_memory_events_it_says_how_to_capture_them(tmp_path, only_memory):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[_op("aten::mm", 10, 20)])
    analysis.analyze_run(con, run_id, Options())
    [(severity, detail)] = con.execute("SELECT severity, detail FROM findings WHERE run_id = ? AND analyzer = 'memory'",
                                       [run_id]).fetchall()
    assert severity == "not_measurable" and "bprof record --memory" in detail


def test_real_resnet_trace_memory_per_step(tmp_path):
    # the 2021 tensorboard-plugin sample: Bytes only, no totals
    con, run_id = recorded.shared(tmp_path, "v100_resnet50_legacy_2021", ["memory"])
    rows = con.execute("SELECT step, peak_allocated_bytes, baseline FROM memory_steps WHERE run_id = ? AND device = 'cuda:0' "
                       "ORDER BY step", [run_id]).fetchall()
    assert [r[0] for r in rows] == [5, 6, 7, 8, 9, 10] and {r[2] for r in rows} == {"trace_start"}
    assert all(p > 1 << 30 for _, p, _ in rows)  # ResNet-50 activations of a batch: gigabytes above the start level
    [(top,)] = con.execute("SELECT name FROM memory_top_ops WHERE run_id = ? AND device = 'cuda:0' "
                           "ORDER BY alloc_bytes DESC LIMIT 1", [run_id]).fetchall()
    assert "onv" in top  # convolutions allocate most in a ResNet


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("memory_real")
    db = recorded.record_train_gpt(out, "memory", ["--microbatches", "2"], record_args=["--memory"], steps="3:5")
    return recorded.analysed(db, ["memory"])


@pytest.mark.slow
def test_real_recording_with_memory_events(real_run):
    con, run_id = real_run
    rows = con.execute("SELECT rank, step, device, peak_allocated_bytes, baseline FROM memory_steps WHERE run_id = ? "
                       "ORDER BY rank, step", [run_id]).fetchall()
    assert [(r, s, d, b) for r, s, d, _, b in rows] == [(r, s, "cpu", "absolute") for r in (0, 1) for s in (3, 4)]
    # Data-parallel replicas hold the same model, gradients and activations, but how long gradient
    # buckets stay alive depends on when gloo finishes their all-reduce: a contended step peaks higher
    # (seen in CI: 17.7 MB against 14.0 MB). The floor of each rank's steps is the same.
    floors = [min(p for r, _, _, p, _ in rows if r == rank) for rank in (0, 1)]
    assert min(floors) > 0 and max(floors) < 1.1 * min(floors), rows
    assert con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND analyzer = 'memory'", [run_id]).fetchone()[0] == 0
    top = [n for (n,) in con.execute("SELECT name FROM memory_top_ops WHERE run_id = ? AND rank = 0 ORDER BY alloc_bytes DESC LIMIT 3",
                                     [run_id]).fetchall()]
    assert len(top) == 3 and any(n.startswith("aten::") or "Backward" in n for n in top)
