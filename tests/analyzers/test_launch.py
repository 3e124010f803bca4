"""Launch statistics: exact on tiny hand-built GPU timelines, CUDA graphs of a synthetic run against
its planted counts, real GPU traces, and the explicit "not measurable" of a CPU run."""

import json

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from tests.analyzers import recorded
from tests.analyzers.tables import tiny_store

US = 1_000


@pytest.fixture(autouse=True)
def only_launch(monkeypatch):
    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "breakdown", "launch"])


def _launch(name, ts, corr):
    return {"kind": "cuda_runtime", "name": name, "ts_ns": ts, "dur_ns": 2 * US, "correlation": corr}


def _kernel(name, ts, dur, corr):
    return {"kind": "kernel", "name": name, "ts_ns": ts, "dur_ns": dur, "correlation": corr}


def _row(con, run_id):
    cur = con.execute("SELECT * EXCLUDE (run_id, rank, step) FROM launch_steps WHERE run_id = ?", [run_id])
    names = [d[0] for d in cur.description]
    [row] = cur.fetchall()
    return dict(zip(names, row))


def test_launch_statistics_are_exact(tmp_path):
    a, b = "elementwise_kernel_a", "vectorized_b"
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 1000 * US)], events=[
        _launch("cudaLaunchKernel", 0, 1), _kernel("ampere_sgemm_128x64_nn", 5 * US, 50 * US, 1),
        _launch("cudaLaunchKernel", 60 * US, 2), _kernel(a, 62 * US, 3 * US, 2),
        _launch("cudaLaunchKernel", 70 * US, 3), _kernel(a, 71 * US, 4 * US, 3),     # 6 µs gap after a tiny kernel
        _launch("cudaLaunchKernel", 80 * US, 4), _kernel(a, 84 * US, 2 * US, 4),     # 9 µs gap
        _launch("cudaGraphLaunch", 100 * US, 5),                                     # one graph, three kernels
        _kernel("ampere_sgemm_128x64_nn", 110 * US, 20 * US, 5), _kernel(b, 130 * US, 5 * US, 5), _kernel(b, 135 * US, 5 * US, 5),
        _launch("cudaMemcpyAsync", 200 * US, 6),
        {"kind": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts_ns": 201 * US, "dur_ns": 10 * US, "correlation": 6},
    ])
    analysis.analyze_run(con, run_id, Options())
    assert _row(con, run_id) == {
        "num_kernels": 7, "kernel_ns": 89 * US, "num_launches": 6,
        "median_launch_latency_ns": 4 * US, "p95_launch_latency_ns": 10 * US,
        "num_tiny_kernels": 5, "tiny_kernel_ns": 19 * US, "num_tiny_gaps": 2, "tiny_gap_ns": 15 * US,
        "num_graph_launches": 1, "num_graph_kernels": 3}
    assert con.execute("SELECT name, num_kernels, dur_ns, num_tiny_gaps_after FROM launch_tiny_kernels WHERE run_id = ? ORDER BY name",
                       [run_id]).fetchall() == [(a, 3, 9 * US, 2), (b, 2, 10 * US, 0)]
    # five tiny kernels are not a storm
    assert con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND analyzer = 'launch'", [run_id]).fetchone()[0] == 0


def test_driver_api_launches_are_launches_once_per_correlation(tmp_path):
    """NCCL 2.27 and Triton launch through the driver API (cuda_driver rows, as on the B200 vLLM
    trace); a driver call nested in a runtime call with the same correlation id is one launch."""
    driver = {"kind": "cuda_driver", "dur_ns": 2 * US}
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 1000 * US)], events=[
        _launch("cudaLaunchKernel", 0, 1), _kernel("sm100_xmma_gemm_bf16", 5 * US, 50 * US, 1),
        {**driver, "name": "cuLaunchKernelEx", "ts_ns": 60 * US, "correlation": 2},
        _kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 62 * US, 100 * US, 2),
        _launch("cudaLaunchKernelExC", 200 * US, 3), {**driver, "name": "cuLaunchKernelEx", "ts_ns": 201 * US, "correlation": 3},
        _kernel("triton_poi_fused_add_0", 208 * US, 20 * US, 3),
    ])
    analysis.analyze_run(con, run_id, Options())
    row = _row(con, run_id)
    assert (row["num_kernels"], row["num_launches"], row["median_launch_latency_ns"], row["p95_launch_latency_ns"]) \
        == (3, 3, 5 * US, 8 * US)


def test_a_tiny_kernel_storm_costs_its_gaps(tmp_path):
    n, period = 200, 20 * US
    events = []
    for i in range(n):
        events += [_launch("cudaLaunchKernel", i * period, i), _kernel("elementwise_kernel", i * period + 5 * US, 5 * US, i)]
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, n * period)], events=events)
    analysis.analyze_run(con, run_id, Options())
    [(severity, lost_ns, title, evidence)] = con.execute(
        "SELECT severity, lost_ns, title, evidence FROM findings WHERE run_id = ? AND analyzer = 'launch'", [run_id]).fetchall()
    assert lost_ns == (n - 1) * 15 * US and severity == "critical"
    assert title.startswith("Tiny-kernel storm: 200 kernels")
    assert json.loads(evidence)["tiny_kernels"] == ["elementwise_kernel"]


def test_cpu_run_launches_are_not_measurable(tmp_path):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, 100)], events=[
        {"kind": "cpu_op", "name": "aten::mm", "ts_ns": 10, "dur_ns": 20}])
    analysis.analyze_run(con, run_id, Options())
    assert con.execute("SELECT severity, lost_ns FROM findings WHERE run_id = ? AND analyzer = 'launch'",
                       [run_id]).fetchall() == [("not_measurable", None)]
    assert con.execute("SELECT count(*) FROM launch_steps WHERE run_id = ?", [run_id]).fetchone()[0] == 0


@pytest.mark.parametrize("fmt", ["modern", "2022"])
def test_synthetic_graph_launches_match_the_planted_counts(tmp_path, fmt):
    from bprof.store.db import open_store
    from bprof.store.ingest import IngestOptions, ingest_paths
    from bprof.synth import Scenario, write_run

    truth = write_run(Scenario(tp=2, pp=2, dp=1, steps=3, layers=2, microbatches=2, seed=2, fmt=fmt), tmp_path / "run")
    con = open_store(tmp_path / "s.duckdb")
    [result] = ingest_paths(con, [tmp_path / "run"], IngestOptions(name="synth"))
    analysis.analyze_run(con, result.run_id, Options())
    got = {r: (g, k, n) for r, g, k, n in con.execute(
        """SELECT rank, sum(num_graph_launches), sum(num_graph_kernels), sum(num_kernels) FROM launch_steps
           WHERE run_id = ? GROUP BY rank""", [result.run_id]).fetchall()}
    assert sorted(got) == list(range(truth["world_size"]))
    for r in truth["ranks"]:
        graphs, graph_kernels, kernels = got[r["rank"]]
        assert graphs == r["counts"]["num_cuda_graph_launches"] and graph_kernels == 3 * graphs  # 3 kernels per graph
        # kernels belong to the span holding their start; a few launched late in the last step may run past it
        assert r["counts"]["num_kernels"] * 0.98 <= kernels <= r["counts"]["num_kernels"]
    assert (fmt == "modern") == (sum(g for g, _, _ in got.values()) > 0)


def test_real_trace_with_cuda_graphs(tmp_path):
    con, run_id = recorded.shared(tmp_path, "a100_ws16_rank0", ["launch"])
    rows = con.execute("""SELECT step, num_graph_launches, num_graph_kernels, num_kernels, median_launch_latency_ns,
                                 p95_launch_latency_ns FROM launch_steps WHERE run_id = ? ORDER BY step""", [run_id]).fetchall()
    assert len(rows) == 5
    for step, graphs, graph_kernels, kernels, median_ns, p95_ns in rows:
        assert 0 < graphs < graph_kernels < kernels, step
        assert 0 < median_ns <= p95_ns, step
