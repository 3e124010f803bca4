"""Kernel classes, FLOPs from shapes, and MFU/HFU on tiny hand-built runs with exact expectations."""

import json
from datetime import datetime, timezone

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.peaks import MeasuredPeak, save_peaks
from tests.analyzers.tables import tiny_store

A100 = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 84990623744, "computeMajor": 8,
         "computeMinor": 0, "numSms": 108}]
MM = {"Input Dims": [[64, 128], [128, 256]], "Input type": ["float", "float"], "Concrete Inputs": ["", ""]}
MM_FLOPS = 2 * 64 * 128 * 256
SECOND = 1_000_000_000


@pytest.fixture(autouse=True)
def analyzers(monkeypatch):
    monkeypatch.setattr(analysis, "ANALYZERS", ["timeline", "breakdown", "kernels", "metrics"])


def _metrics(con, run_id):
    return dict(con.execute("SELECT name, value FROM metrics WHERE run_id = ?", [run_id]).fetchall())


def _gpu_run(tmp_path, *, graph=False, model=None, dtype_args=MM):
    events = [
        {"kind": "cpu_op", "name": "aten::mm", "ts_ns": 10, "dur_ns": 40, "args": dtype_args, "step": 1},
        {"kind": "cuda_runtime", "name": "cudaLaunchKernel", "ts_ns": 20, "dur_ns": 5, "correlation": 5, "step": 1},
        {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": 100, "dur_ns": SECOND // 2, "correlation": 5, "step": 1},
    ]
    if graph:
        events += [
            {"kind": "cuda_runtime", "name": "cudaGraphLaunch", "ts_ns": 60, "dur_ns": 5, "correlation": 9, "step": 1},
            {"kind": "kernel", "name": "ampere_sgemm_128x64_nn", "ts_ns": SECOND // 2 + 200, "dur_ns": SECOND // 4,
             "correlation": 9, "step": 1},
            {"kind": "kernel", "name": "vectorized_elementwise_kernel", "ts_ns": 3 * SECOND // 4 + 300, "dur_ns": 100,
             "correlation": 9, "step": 1},
        ]
    return tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, SECOND)], events=events, device_properties=A100, model=model)


def test_flops_come_from_shapes_and_kernels_take_their_launching_op(tmp_path):
    con, run_id = _gpu_run(tmp_path)
    analysis.analyze_run(con, run_id, Options())
    [(name, flops, dur_ns, dtype)] = con.execute(
        "SELECT name, flops, dur_ns, dtype FROM kernels_ops WHERE run_id = ?", [run_id]).fetchall()
    assert (name, flops, dur_ns, dtype) == ("aten::mm", MM_FLOPS, SECOND // 2, "fp32")
    [(executed, coverage, mm_dtype)] = con.execute(
        "SELECT executed_flops, flop_coverage_frac, matmul_dtype FROM kernels_flops WHERE run_id = ?", [run_id]).fetchall()
    assert (executed, coverage, mm_dtype) == (MM_FLOPS, 1.0, "fp32")


def test_cuda_graph_kernels_are_counted_and_lower_flop_coverage(tmp_path):
    con, run_id = _gpu_run(tmp_path, graph=True)
    analysis.analyze_run(con, run_id, Options())
    got = dict(con.execute("SELECT fine_class, num_graph_kernels FROM kernels_classes WHERE run_id = ?", [run_id]).fetchall())
    assert got == {"gemm": 1, "elementwise": 1}
    coverage = con.execute("SELECT flop_coverage_frac FROM kernels_flops WHERE run_id = ?", [run_id]).fetchone()[0]
    assert coverage == pytest.approx(0.5 / 0.75)
    m = _metrics(con, run_id)
    assert m["flop_coverage_frac"] == pytest.approx(0.5 / 0.75)
    assert m["hfu_frac"] is None  # below 90 % coverage: not measurable, never a low-looking number
    titles = [t for (t,) in con.execute("SELECT title FROM findings WHERE run_id = ? AND severity = 'not_measurable'",
                                        [run_id]).fetchall()]
    assert any(t.startswith("HFU is not measurable") for t in titles)


def test_mfu_and_hfu_from_the_datasheet_peak_at_the_matmul_dtype(tmp_path):
    model_flops = 2e12
    con, run_id = _gpu_run(tmp_path, model={"model_flops_per_step": model_flops, "tokens_per_step": 4096})
    analysis.analyze_run(con, run_id, Options())
    m = _metrics(con, run_id)
    assert m["step_time_ns"] == SECOND  # the CPU step ends after its last kernel
    step_s = 1.0
    fp32_peak = 19.5e12  # A100 SXM 80GB fp32 (non-tensor) dense: the matmuls ran in fp32
    assert m["peak_flops_per_s_per_device"] == fp32_peak
    assert m["mfu_frac"] == pytest.approx(model_flops / (step_s * fp32_peak))
    assert m["hfu_frac"] == pytest.approx(MM_FLOPS / (step_s * fp32_peak))
    assert m["tokens_per_s"] == pytest.approx(4096 / step_s)


def test_fp32_matmuls_on_a_tensor_core_gpu_are_priced_by_the_peak_ratio(tmp_path):
    con, run_id = _gpu_run(tmp_path)
    analysis.analyze_run(con, run_id, Options())
    [(lost_ns, title, evidence)] = con.execute(
        "SELECT lost_ns, title, evidence FROM findings WHERE run_id = ? AND title LIKE 'fp32 matmuls%'", [run_id]).fetchall()
    assert json.loads(evidence)["dtype"] == "bf16"
    assert lost_ns == int((SECOND // 2) * (1 - 19.5e12 / 312e12))


def test_cpu_peak_comes_from_calibration_shared_by_the_ranks_of_the_host(tmp_path):
    events = []
    for rank in (0, 1):
        events += [{"rank": rank, "kind": "cpu_op", "name": "aten::mm", "ts_ns": 10, "dur_ns": SECOND // 2, "args": MM, "step": 1}]
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=2, steps=[(r, 1, 0, SECOND) for r in (0, 1)], events=events,
                             model={"model_flops_per_step": 4e9})
    analysis.analyze_run(con, run_id, Options())
    assert _metrics(con, run_id)["mfu_frac"] is None  # not calibrated: not measurable
    [(detail,)] = con.execute("SELECT detail FROM findings WHERE run_id = ? AND title LIKE 'MFU and HFU%'", [run_id]).fetchall()
    assert "bprof calibrate" in detail

    save_peaks(con, [MeasuredPeak("h0", "cpu", "test cpu", "fp32", 2, 1e11, 0.01, 2e10, 1024, 3,
                                  datetime.now(timezone.utc), "2.13.0")])
    analysis.analyze_run(con, run_id, Options())
    m = _metrics(con, run_id)
    assert m["peak_flops_per_s_per_device"] == 5e10  # 1e11 on the host, two ranks on it
    assert m["mfu_frac"] == pytest.approx(4e9 / (1.0 * 2 * 5e10))
    assert m["hfu_frac"] == pytest.approx(2 * MM_FLOPS / (1.0 * 2 * 5e10))


def test_peak_given_on_the_command_line_wins_and_unknown_names_are_counted(tmp_path):
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, 1, 0, SECOND)], events=[
        {"kind": "kernel", "name": "my_custom_fused_thing_kernel", "ts_ns": 100, "dur_ns": 1000, "step": 1}],
        model={"model_flops_per_step": 1e12})
    analysis.analyze_run(con, run_id, Options(peak_flops_per_s=1e13))
    assert _metrics(con, run_id)["mfu_frac"] == pytest.approx(1e12 / 1e13)
    [(title, evidence)] = con.execute("SELECT title, evidence FROM findings WHERE run_id = ? AND title LIKE '%cannot classify%'",
                                      [run_id]).fetchall()
    assert json.loads(evidence)["names"] == ["my_custom_fused_thing_kernel"]


def test_hfu_over_mfu_is_executed_over_declared_flops_however_the_steps_vary(tmp_path):
    """HFU shares MFU's denominator (the run's median step time): one slow step (a contended CPU, a
    checkpoint) must not move their ratio. Three steps of 1, 1 and 3 s, the same matmul in each."""
    starts = [0, SECOND, 2 * SECOND]
    durations = [SECOND, SECOND, 3 * SECOND]
    events = [{"kind": "cpu_op", "name": "aten::mm", "ts_ns": t + 10, "dur_ns": SECOND // 2, "args": MM, "step": s}
              for s, t in enumerate(starts)]
    model_flops = 3 * MM_FLOPS
    con, run_id = tiny_store(tmp_path / "s.duckdb", steps=[(0, s, t, d) for s, (t, d) in enumerate(zip(starts, durations))],
                             events=events, model={"model_flops_per_step": model_flops})
    analysis.analyze_run(con, run_id, Options(peak_flops_per_s=1e9))
    m = _metrics(con, run_id)
    assert m["step_time_ns"] == SECOND  # the median step
    assert m["hfu_frac"] == pytest.approx(MM_FLOPS / (1.0 * 1e9))
    assert m["hfu_frac"] / m["mfu_frac"] == pytest.approx(1 / 3)
