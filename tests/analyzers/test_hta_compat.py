"""HTA 0.5.0's breakdown in compat mode: exact fractions on tiny hand-built runs (HTA's definitions),
and HTA's own numbers on the real traces of ../shared/traces within 0.5 percentage points."""

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.ingest import IngestOptions, ingest_paths
from tests.analyzers.tables import tiny_store
from tests.conftest import shared_trace

US = 1000  # ns

# HTA 0.5.0's own numbers, produced by `.venv/bin/python benchmarks/hta_parity.py --golden` (which
# runs benchmarks/_hta_breakdown.py in bench-data/hta-venv: HolisticTraceAnalysis==0.5.0 from PyPI,
# TraceAnalysis(trace_dir=folder).get_temporal_breakdown() and .get_comm_comp_overlap()) on
# 2026-11-29; rerun it to regenerate them. Breakdown fractions are HTA's unrounded ratios; the
# overlap is its comp_comm_overlap_pctg / 100 (HTA rounds it to 2 digits); None: HTA's NaN (no
# communication kernels).
GOLDEN = {
    'a100_ddp_nccl_rank0': {
        0: {'idle_frac': 0.7777591566303784, 'compute_frac': 0.17256982547648456, 'non_compute_frac': 0.04967101789313706, 'comm_overlap_frac': 0.1431},
    },
    'a100_ws16_rank0': {
        0: {'idle_frac': 0.6943585879353187, 'compute_frac': 0.1414937130737767, 'non_compute_frac': 0.16414769899090456, 'comm_overlap_frac': 0.0137},
    },
    'mi250_rocm_minitoy': {
        0: {'idle_frac': 0.9852990685669397, 'compute_frac': 0.010773201660868589, 'non_compute_frac': 0.003927729772191673, 'comm_overlap_frac': None},
    },
    'v100_ns_resolution_rank0': {
        0: {'idle_frac': 0.026292527441671824, 'compute_frac': 0.9675431709105279, 'non_compute_frac': 0.006164301647800246, 'comm_overlap_frac': None},
    },
    'v100_resnet50_legacy_2021': {
        0: {'idle_frac': 0.3942990557427266, 'compute_frac': 0.593491343706276, 'non_compute_frac': 0.012209600550997358, 'comm_overlap_frac': None},
    },
}
TOLERANCE = 0.005  # 0.5 percentage points

GEMM = "ampere_sgemm_128x64_nn"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def _kernel(name, ts_ns, dur_ns, corr=1, stream=7, kind="kernel"):
    return {"kind": kind, "name": name, "ts_ns": ts_ns, "dur_ns": dur_ns, "args": {"stream": stream, "correlation": corr}}


def _launch(corr, ts_ns, stream=None):
    args = {"correlation": corr} | ({} if stream is None else {"stream": stream})
    return {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts_ns": ts_ns, "dur_ns": 1 * US, "args": args}


def _compat(path, events, steps=(), base_time_ns=0, **kw):
    """Rows of hta_compat_ranks (dicts) and the run's findings, after analyze_run with only hta_compat."""
    con, run_id = tiny_store(path, events=events, steps=steps, **kw)
    # Kineto writes cat on every complete event, and HTA drops events without one
    con.execute("UPDATE events SET cat = kind WHERE run_id = ?", [run_id])
    con.execute("UPDATE ranks SET base_time_ns = ?, time_base = 'relative_base' WHERE run_id = ?", [base_time_ns, run_id])
    con.execute("UPDATE events SET ts_ns = ts_ns + ? WHERE run_id = ?", [base_time_ns, run_id])
    analysis.analyze_run(con, run_id, Options(hta_compat=True))
    cur = con.execute("SELECT * EXCLUDE (run_id) FROM hta_compat_ranks WHERE run_id = ? ORDER BY rank", [run_id])
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    findings = con.execute("SELECT analyzer, severity, title FROM findings WHERE run_id = ?", [run_id]).fetchall()
    return rows, findings


@pytest.fixture
def only_compat(monkeypatch):
    monkeypatch.setattr(analysis, "ANALYZERS", [])


def test_window_idle_compute_non_compute_and_overlap_are_hta_s(tmp_path, only_compat):
    rows, findings = _compat(tmp_path / "s.duckdb", [
        _kernel(GEMM, 0, 10 * US),
        _kernel(NCCL, 5 * US, 15 * US, stream=20),
        _kernel("Memcpy DtoD (Device -> Device)", 30 * US, 5 * US, kind="gpu_memcpy"),
        _kernel(GEMM, 38 * US, 2 * US),
        _kernel(GEMM, 39 * US, 1 * US),  # overlaps the last one: counted once
    ])
    # window 0..40 µs; busy = [0, 20] + [30, 35] + [38, 40] = 27 µs; compute = [0, 10] + [38, 40]
    [row] = rows
    assert (row["window_ts_ns"], row["window_dur_ns"]) == (0, 40 * US)
    assert (row["idle_ns"], row["compute_ns"], row["non_compute_ns"], row["comm_ns"], row["comm_overlap_ns"]) == (
        13 * US, 12 * US, 15 * US, 15 * US, 5 * US)
    assert (row["idle_frac"], row["compute_frac"], row["non_compute_frac"]) == pytest.approx((13 / 40, 12 / 40, 15 / 40))
    assert row["comm_overlap_frac"] == pytest.approx(5 / 15)
    assert (row["num_events"], row["last_step_dropped"]) == (5, False)
    assert findings == []


def test_events_are_rounded_inward_to_whole_us_on_the_file_s_own_clock(tmp_path, only_compat):
    # baseTimeNanoseconds 500 ns past a whole µs: HTA rounds the file's relative ts, not the epoch time
    base = 1_700_000_000_000_000_500
    rows, _ = _compat(tmp_path / "s.duckdb", [
        _kernel(GEMM, 1_200, 2_600),            # 1.2 .. 3.8 µs -> 2 .. 3 µs
        _kernel(GEMM, 6_000, 1_000),            # 6 .. 7 µs, unchanged
        _kernel(GEMM, 9_100, 1_000),            # 9.1 .. 10.1 µs -> 10 .. 10 µs: empty, but still ends the window
    ], base_time_ns=base)
    [row] = rows
    assert (row["window_ts_ns"] - base, row["window_dur_ns"]) == (2 * US, 8 * US)
    assert (row["compute_ns"], row["idle_ns"]) == (2 * US, 6 * US)


def test_kernels_launched_in_the_last_step_or_without_a_launch_are_dropped(tmp_path, only_compat):
    # two ProfilerStep names: HTA keeps CPU events before the last step's start and the GPU events they launched
    steps = [(0, 1, 10 * US, 40 * US), (0, 2, 50 * US, 40 * US)]
    events = [
        _launch(1, 0), _kernel(GEMM, 2 * US, 4 * US, corr=1),              # launched before step 1: kept
        _launch(2, 20 * US), _kernel(GEMM, 30 * US, 10 * US, corr=2),      # step 1: kept
        _launch(3, 52 * US), _kernel(GEMM, 60 * US, 20 * US, corr=3),      # step 2, the last: dropped
        _kernel(GEMM, 45 * US, 1 * US, corr=9),                            # no launch recorded: dropped
    ]
    [row], _ = _compat(tmp_path / "s.duckdb", events, steps=steps)
    assert (row["window_ts_ns"], row["window_dur_ns"], row["compute_ns"], row["num_events"]) == (2 * US, 38 * US, 14 * US, 2)
    assert row["last_step_dropped"] is True


def test_with_one_profiler_step_name_nothing_is_dropped(tmp_path, only_compat):
    events = [_launch(1, 0), _kernel(GEMM, 2 * US, 4 * US, corr=1), _launch(3, 52 * US),
              _kernel(GEMM, 60 * US, 20 * US, corr=3), _kernel(GEMM, 45 * US, 1 * US, corr=9)]
    [row], _ = _compat(tmp_path / "s.duckdb", events, steps=[(0, 1, 50 * US, 40 * US)])
    assert (row["window_ts_ns"], row["window_dur_ns"], row["num_events"], row["last_step_dropped"]) == (2 * US, 78 * US, 3, False)


def test_a_rocm_runtime_call_with_stream_0x0_is_cpu_side(tmp_path, only_compat):
    # Python's int('0x0') fails, so HTA counts hipLaunchKernel as CPU (DuckDB would cast '0x0' to 0)
    events = [
        {"kind": "cuda_runtime", "name": "hipLaunchKernel", "ts_ns": 0, "dur_ns": 50 * US, "args": {"stream": "0x0", "correlation": 1}},
        _kernel(GEMM, 10 * US, 10 * US, corr=1, stream=0),
    ]
    [row], _ = _compat(tmp_path / "s.duckdb", events)
    assert (row["window_ts_ns"], row["window_dur_ns"], row["compute_frac"], row["num_events"]) == (10 * US, 10 * US, 1.0, 1)


@pytest.mark.parametrize("name, kind, kernel_type", [
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "kernel", "communication"),
    (NCCL, "kernel", "communication"),
    ("Memcpy PtoP (Device -> Device)", "gpu_memcpy", "memory"),  # communication in bprof's catalogue
    ("Memset (Device)", "gpu_memset", "memory"),
    ("dma_copy_kernel", "kernel", "memory"),
    ("void deep_ep::intranode::dispatch<8, 768>(void*)", "kernel", "computation"),  # communication in bprof's catalogue
    ("void cub::DeviceSyncKernel()", "kernel", "other"),
    ("void at::native::cudaMemcpyLikeKernel()", "kernel", "other"),
    ("Stream Wait Event", "kernel", "computation"),
])
def test_kernel_types_follow_hta_s_name_rules(tmp_path, only_compat, name, kind, kernel_type):
    [row], _ = _compat(tmp_path / "s.duckdb", [_kernel(name, 0, 10 * US, kind=kind), _kernel(GEMM, 10 * US, 10 * US)])
    compute_ns = {"computation": 20 * US}.get(kernel_type, 10 * US)
    comm_ns = 10 * US if kernel_type == "communication" else 0
    assert (row["compute_ns"], row["non_compute_ns"], row["comm_ns"]) == (compute_ns, 20 * US - compute_ns, comm_ns)
    assert row["comm_overlap_frac"] == (0.0 if comm_ns else None)


def test_a_run_without_gpu_events_is_not_measurable_not_zero(tmp_path, only_compat):
    rows, findings = _compat(tmp_path / "s.duckdb", [{"kind": "cpu_op", "name": "aten::mm", "ts_ns": 0, "dur_ns": 10 * US}])
    assert rows == []
    assert [(a, s) for a, s, _ in findings] == [("hta_compat", "not_measurable")]


def test_every_column_has_a_comment(tmp_path, only_compat):
    con, run_id = tiny_store(tmp_path / "s.duckdb")
    analysis.analyze_run(con, run_id, Options(hta_compat=True))
    missing = con.execute("""SELECT column_name FROM duckdb_columns()
                             WHERE table_name = 'hta_compat_ranks' AND coalesce(comment, '') = ''""").fetchall()
    assert missing == []
    assert con.execute("SELECT comment FROM duckdb_tables() WHERE table_name = 'hta_compat_ranks'").fetchone()[0]


@pytest.mark.parametrize("folder", sorted(GOLDEN))
def test_real_traces_match_hta_0_5_within_half_a_point(tmp_path, monkeypatch, folder):
    path = shared_trace(folder)
    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "breakdown"])
    from bprof.store.db import open_store

    con = open_store(tmp_path / "s.duckdb")
    [ingested] = ingest_paths(con, [path], IngestOptions(rank=0 if len(list(path.iterdir())) == 1 else None,
                                                         work_dir=tmp_path))
    analysis.analyze_run(con, ingested.run_id, Options(hta_compat=True))
    ranks = {r["rank"]: r["hta"] for r in analysis.summary(con, ingested.run_id)["ranks"]}
    assert sorted(ranks) == sorted(GOLDEN[folder])
    for rank, expected in GOLDEN[folder].items():
        for metric, value in expected.items():
            got = ranks[rank][metric]
            if value is None:
                assert got is None, (rank, metric)
            else:
                assert got == pytest.approx(value, abs=TOLERANCE), (rank, metric)
