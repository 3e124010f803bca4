"""The launch-level device graph (bprof.whatif.device_graph): its unchanged replay reproduces every
measured time of every real GPU trace of ../shared (skips without it); on planted one-GPU traces
(Kineto JSON written here: ProfilerStep ranges, cudaLaunchKernel calls, kernels on stream 7 tied by
correlation, an aten::item copy + cudaStreamSynchronize) scale:gemm=0.5 buys ~0 when the host issues
kernels slower than the GPU runs them and half the GEMM time when the GPU is the bottleneck, where
the segment model says half the GEMM time for both; a host sync after faster kernels returns
earlier and the launches after it move with it; with no sync, launches into a full launch queue
make the host wait for the GPU, and the step gains half the GEMM time again; a synthetic run with
compute twice as slow is predicted back to the healthy run within 1 %."""

import gzip
import json

import numpy as np
import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.whatif import device_graph
from bprof.whatif.run import whatif
from bprof.whatif.scenarios import Scale, segment_model_steps
from tests.analyzers import recorded

# Steps are measured on the device (issue 21): where it lags, a step's span starts after its CPU
# calls, which the graph anchors to the step's start on the host instead
GPU_FOLDERS = ["a100_ddp_nccl_rank0", "a100_ws16_rank0", "v100_ns_resolution_rank0", "mi250_rocm_minitoy",
               "v100_resnet50_legacy_2021"]


@pytest.mark.parametrize("folder", GPU_FOLDERS)
def test_unchanged_replay_reproduces_every_node_of_the_real_traces(tmp_path, folder):
    con, run_id = recorded.shared(tmp_path, folder, ["match", "clock", "idle"])
    assert device_graph.prepare(con, run_id)
    g = device_graph.rank_graph(con, run_id, 0)
    assert g.num_gpu_ops > 0 and (g.delay_ns >= 0).all()
    assert np.array_equal(g.replay(), g.measured_ns)  # every call, kernel, copy, step start and end
    assert np.array_equal(g.replay(g.weights(g.matching(["no such kernel"]), 0.5)), g.measured_ns)
    spans = con.execute("SELECT dur_ns FROM timeline_spans WHERE run_id = ? ORDER BY step", [run_id]).fetchnumpy()["dur_ns"]
    assert g.step_ns(g.replay()).tolist() == spans.tolist()
    # a dependency the measurement contradicts is left out only where the trace cannot say what is
    # waited for (device-wide syncs) or work overlaps on a stream
    assert set(g.dropped) <= {"sync", "stream"}, g.dropped
    # faster GEMMs never make a time point later
    t = g.replay(g.weights(g.matching(_gemm_names(con, run_id)), 0.5))
    assert (t <= g.measured_ns).all()
    print(folder, "time points", len(t), "dropped", g.dropped, "blocked calls", int(g.blocked.sum()))
    out = whatif(con, run_id, ["scale:gemm=1", "scale:gemm=0.8"], write=False)
    for p, m in zip(out.results[1].predicted_ns, out.results[1].measured_ns):
        assert p.tolist() == m.tolist()
    # a step can get longer when its start moved earlier more than its end; the window never does
    assert sum(int(p.sum()) for p in out.results[2].predicted_ns) <= sum(int(m.sum()) for m in out.results[2].measured_ns)
    assert "launch-level graph" in out.summaries[2]["assumptions"][0]
    con.close()


def _gemm_names(con, run_id) -> list[str]:
    part = Scale("gemm", 0.5)
    part.prepare(con, run_id)
    return part.names


# --- planted traces ---------------------------------------------------------------------------

BASE_NS = 1790857026000000000
GEMM = "ampere_sgemm_128x64_nn"
EW = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"
LAYERS, AFTER_SYNC, STEPS = 20, 5, 3


def planted_trace(launch_gap_us: float, gemm_us: float, ew_us: float, queue: int | None = None) -> tuple[dict, dict]:
    """One GPU rank, STEPS steps: per layer aten::mm launching a GEMM and aten::add an elementwise
    kernel, `launch_gap_us` of host time apart; then aten::item (a DtoH copy and a
    cudaStreamSynchronize that returns when the GPU is done) and AFTER_SYNC more launches. The GPU
    runs each kernel 3 us after its launch or when its stream is free. With `queue`, the launch
    queue holds that many kernels: a launch returns only once the kernel `queue` launches before it
    ended, and there is no aten::item. Returns (trace, truth)."""
    pid, tid = 100, 100
    ev, ext, corr = [], 1, 1
    t, gpu_free = 1000.0, 0.0
    gemm_total = 0.0
    ends = []

    def cpu(name, ts, dur):
        nonlocal ext
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": pid, "tid": tid, "ts": round(ts, 3), "dur": dur,
                   "args": {"External id": ext}})
        ext += 1
        return ext - 1

    def launch(kernel, ts, dur_us, cat="kernel", call="cudaLaunchKernel", op="aten::mm"):
        nonlocal corr, gpu_free
        call_end = ts + 3.0
        if queue and len(ends) >= queue:
            call_end = max(call_end, ends[-queue] + 1.0)
        e = cpu(op, ts, round(call_end - ts + 1, 3))
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": call, "pid": pid, "tid": tid, "ts": round(ts + 1, 3),
                   "dur": round(call_end - ts - 1, 3), "args": {"External id": e, "cbid": 211, "correlation": corr}})
        start = max(ts + 1 + 3, gpu_free)
        ev.append({"ph": "X", "cat": cat, "name": kernel, "pid": 0, "tid": 7, "ts": round(start, 3), "dur": dur_us,
                   "args": {"External id": e, "device": 0, "context": 1, "stream": 7, "correlation": corr,
                            "queued": 0}})
        corr += 1
        gpu_free = start + dur_us
        ends.append(gpu_free)
        return call_end + 1.0

    truth = {"sync_end_us": [], "step_us": []}
    for step in range(1, STEPS + 1):
        step_start = t
        t += 20.0
        for _ in range(LAYERS):
            t = launch(GEMM, t, gemm_us) + launch_gap_us / 2
            gemm_total += gemm_us
            t = launch(EW, t, ew_us, op="aten::add") + launch_gap_us / 2
        if queue:
            t += 10.0
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": tid,
                       "ts": round(step_start, 3), "dur": round(t - step_start, 3), "args": {}})
            t += 5.0
            continue
        t = launch("Memcpy DtoH (Device -> Pageable)", t, 2.0, cat="gpu_memcpy", call="cudaMemcpyAsync", op="aten::item")
        t += 6.0
        sync_end = max(t + 2.0, gpu_free + 1.0)
        e = cpu("aten::_local_scalar_dense", t - 1.0, sync_end - t + 2.0)
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": pid, "tid": tid,
                   "ts": round(t, 3), "dur": round(sync_end - t, 3), "args": {"External id": e, "cbid": 131, "correlation": corr}})
        corr += 1
        truth["sync_end_us"].append(sync_end)
        t = sync_end + 5.0
        for _ in range(AFTER_SYNC):
            t = launch(EW, t, ew_us, op="aten::add") + 5.0
        t += 10.0
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": tid,
                   "ts": round(step_start, 3), "dur": round(t - step_start, 3), "args": {}})
        truth["step_us"].append(t - step_start)
        t += 5.0
    truth["gemm_us_per_step"] = gemm_total / STEPS
    trace = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85899345920,
                                                       "computeMajor": 8, "computeMinor": 0, "numSms": 108}],
             "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
             "traceEvents": ev, "traceName": "planted", "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS}
    return trace, truth


def _store(tmp_path, name, trace):
    path = tmp_path / name / "rank0.json.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    con = open_store(tmp_path / f"{name}.duckdb")
    [r] = ingest_paths(con, [path.parent], IngestOptions(name=name, rank=0, work_dir=tmp_path))
    analysis.analyze_run(con, r.run_id, Options())
    return con, r.run_id




@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("planted")
    runs = {}
    # launch-bound: 50 us of host time per layer, 10 us GEMMs; GPU-bound: 5 us per layer, 100 us GEMMs
    # queue_bound: GPU-bound with no sync: the host waits in launches into a full queue of 8 kernels
    for name, shape in {"launch_bound": (50.0, 10.0, 5.0), "gpu_bound": (5.0, 100.0, 5.0),
                        "queue_bound": (5.0, 100.0, 5.0, 8)}.items():
        trace, truth = planted_trace(*shape)
        con, run_id = _store(tmp, name, trace)
        runs[name] = (con, run_id, truth)
    yield runs
    for con, _, _ in runs.values():
        con.close()


def test_launch_bound_gains_nothing_gpu_bound_gains_half_the_gemm_time(planted):
    results = {}
    for name, (con, run_id, truth) in planted.items():
        out = whatif(con, run_id, ["scale:gemm=0.5"], write=False)
        measured, predicted = out.results[1].job_steps()
        segment = segment_model_steps(con, run_id, [Scale("gemm", 0.5)])
        gemm_ns = truth["gemm_us_per_step"] * 1000
        device_gain = [m - p for m, p in zip(measured, predicted)]
        segment_gain = [m - p for m, p in zip(measured, segment)]
        results[name] = (device_gain, segment_gain, gemm_ns)
        print(name, "measured", measured, "device graph", predicted, "segment model", segment, "gemm/step", gemm_ns)
        # the segment model subtracts half the GEMM time in the step whatever bounds it
        if name != "queue_bound":  # (there, GEMMs of one step run in the next)
            for gain in segment_gain:
                assert gain == pytest.approx(gemm_ns / 2, rel=0.01)
        assert "launch-level graph" in out.summaries[1]["assumptions"][0]
    device, _, gemm_ns = results["launch_bound"]
    # the host issues a layer every 50 us, the GPU runs it in 15: faster GEMMs end sooner and wait
    assert all(abs(gain) <= 0.01 * gemm_ns for gain in device), device
    device, _, gemm_ns = results["gpu_bound"]
    # the step waits in aten::item for the GPU's queue: half the GEMM time, less the launch lead
    assert all(gain == pytest.approx(gemm_ns / 2, rel=0.02) for gain in device), device
    device, _, gemm_ns = results["queue_bound"]
    # no sync: the host waits in launches into the full queue; over the window, half the GEMM time
    # per step (the first step gains less: its first launches found the queue empty; the last more:
    # it ends with the device)
    assert sum(device) == pytest.approx(STEPS * gemm_ns / 2, rel=0.02), device
    assert device[1] == pytest.approx(gemm_ns / 2, rel=0.02), device


def test_launches_into_a_full_queue_wait_for_the_gpu(planted, monkeypatch):
    con, run_id, truth = planted["queue_bound"]
    assert device_graph.prepare(con, run_id)
    g = device_graph.rank_graph(con, run_id, 0)
    assert g.blocked.sum() >= LAYERS and not g.blocked[~g.is_host].any()
    gain = g.step_ns(g.measured_ns) - g.step_ns(g.replay(g.weights(g.matching([GEMM]), 0.5)))
    assert gain[1] == pytest.approx(truth["gemm_us_per_step"] * 1000 / 2, rel=0.02)
    # the same trace with no call taken as blocked: the host never waits, a middle step gains nothing
    monkeypatch.setattr(device_graph, "BLOCKED_MIN_NS", 10**15)
    g = device_graph.rank_graph(con, run_id, 0)
    assert not g.blocked.any() and np.array_equal(g.replay(), g.measured_ns)
    gain = g.step_ns(g.measured_ns) - g.step_ns(g.replay(g.weights(g.matching([GEMM]), 0.5)))
    assert gain[1] == 0


def test_a_sync_after_faster_kernels_returns_earlier_and_the_launches_after_it_move(planted):
    con, run_id, truth = planted["gpu_bound"]
    assert device_graph.prepare(con, run_id)
    g = device_graph.rank_graph(con, run_id, 0)
    assert not g.dropped
    t = g.replay(g.weights(g.matching(["aten::mm"]), 0.5))  # by the op that launched them: the GEMMs
    assert np.array_equal(t, g.replay(g.weights(g.matching([GEMM]), 0.5)))
    shift = t - g.measured_ns
    [sync, *_] = np.flatnonzero(g.names == "cudaStreamSynchronize")  # the first step's
    assert g.measured_ns[2 * sync + 1] == BASE_NS + round(truth["sync_end_us"][0] * 1000)
    gemm_ns = truth["gemm_us_per_step"] * 1000
    assert shift[2 * sync] == 0  # the call starts when it did: the host was ahead
    assert shift[2 * sync + 1] == pytest.approx(-gemm_ns / 2, rel=0.02)  # and returns earlier
    starts = g.measured_ns[0:2 * g.num_ops:2]
    first_step = g.is_host & (g.op_step == 0)
    later = np.flatnonzero(first_step & (starts > g.measured_ns[2 * sync + 1]))
    assert len(later) == AFTER_SYNC
    assert (shift[2 * later] == shift[2 * sync + 1]).all() and shift[g.end_point(0)] == shift[2 * sync + 1]
    # before the sync the host does not move: it never waited for the GPU
    earlier = np.flatnonzero(first_step & (starts < g.measured_ns[2 * sync]))
    assert (shift[2 * earlier] == 0).all()
    # the next step starts earlier by as much, and gains as much again
    assert shift[g.start_point(1)] == shift[2 * sync + 1]
    assert g.step_ns(t).tolist() == pytest.approx((g.step_ns(g.measured_ns) - gemm_ns / 2).tolist(), rel=0.02)


def test_scale_parts_of_one_scenario_replay_the_graph_together(planted):
    """Each part's change is measured with the parts before it applied, so the scenario's prediction
    is one replay with all of them (changes do not add in a max-plus graph)."""
    for name in ("launch_bound", "gpu_bound"):
        con, run_id, _ = planted[name]
        out = whatif(con, run_id, ["scale:gemm=0.5+scale:aten::add=0.2"], write=False)
        assert device_graph.prepare(con, run_id)
        g = device_graph.rank_graph(con, run_id, 0)
        t = g.replay(g.weights(g.matching(["aten::add"]), 0.2, g.weights(g.matching([GEMM]), 0.5)))
        assert [int(p[0]) for p in out.results[1].predicted_ns] == g.step_ns(t).tolist()
        if name == "gpu_bound":  # both classes on the critical path: more than GEMMs alone
            alone = g.step_ns(g.replay(g.weights(g.matching([GEMM]), 0.5)))
            assert (g.step_ns(t) < alone).all()


def test_compute_twice_as_slow_predicted_back_to_the_healthy_run(tmp_path):
    """bprof.synth (tp2 x dp2, compute on stream 7, collectives on their own streams waiting for it
    and it for their results, the host blocking only in aten::item): the run with every compute
    kernel 2x slower (slow_host draws the same random numbers, only those kernels differ), every
    compute class scaled by 0.5 in one scenario, predicts the healthy run's steps."""
    from bprof.kernels.classify import classify_many
    from bprof.synth import Fault, Scenario, write_run

    steps = {}
    for name, faults in (("healthy", []), ("slow", [Fault("slow_host", host=0, factor=2.0)])):
        write_run(Scenario(tp=2, pp=1, dp=2, steps=3, hosts=1, seed=5, faults=faults), tmp_path / name)
        con = open_store(tmp_path / f"{name}.duckdb")
        [r] = ingest_paths(con, [tmp_path / name], IngestOptions(name=name, work_dir=tmp_path))
        analysis.analyze_run(con, r.run_id, Options())
        if name == "slow":
            pairs = con.execute("SELECT DISTINCT name, 'kernel' FROM events WHERE run_id = ? AND kind = 'kernel' "
                                "AND stream = 7", [r.run_id]).fetchall()
            text = "+".join(f"scale:{c}=0.5" for c in sorted({f for _, _, f, _, _ in classify_many(pairs)} - {"unknown"}))
            out = whatif(con, r.run_id, [text], write=False)
            steps["slow"], steps["predicted"] = out.results[1].job_steps()
            assert device_graph.rank_graph(con, r.run_id, 0).kept.get("event", 0) > 0  # waits between streams
        else:
            steps["healthy"], _ = whatif(con, r.run_id, [], write=False).results[0].job_steps()
        con.close()
    print(steps)
    for slow, healthy, predicted in zip(steps["slow"], steps["healthy"], steps["predicted"]):
        assert slow > 1.5 * healthy
        assert predicted == pytest.approx(healthy, rel=0.01)
