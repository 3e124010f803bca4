"""Analysis of synthetic runs against their planted truth: FLOPs, CUDA-graph kernels, roofline, fp8."""

import json

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.synth import Scenario, write_run
from bprof.synth.catalog import GEMM_EFF


def _analysed(tmp_path_factory, scenario: Scenario, **options):
    out = tmp_path_factory.mktemp("synth")
    truth = write_run(scenario, out / "run")
    con = open_store(out / "s.duckdb")
    [r] = ingest_paths(con, [out / "run"], IngestOptions(name="synth"))
    analysis.analyze_run(con, r.run_id, Options(**options))
    return con, r.run_id, truth


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return _analysed(tmp_path_factory, Scenario(tp=2, pp=2, dp=1, steps=2, seed=5))


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    return _analysed(tmp_path_factory, Scenario(tp=2, pp=1, dp=1, steps=2, device="H100", dtype="fp8", seed=5))


def _flops(con, run_id):
    return {(r, s): f for r, s, f in con.execute(
        "SELECT rank, step, executed_flops FROM kernels_flops WHERE run_id = ?", [run_id]).fetchall()}


@pytest.mark.parametrize("which", ["bf16", "fp8"])
def test_executed_flops_equal_the_planted_ones(which, request):
    con, run_id, truth = request.getfixturevalue(which)
    got = _flops(con, run_id)
    for r in truth["ranks"]:
        for step, planted in zip(r["steps"], r["step_executed_flops"]):
            assert got[(r["rank"], step)] == pytest.approx(planted, rel=1e-9), (r["rank"], step)


def test_cuda_graph_kernels_are_counted(bf16):
    con, run_id, truth = bf16
    launches = sum(r["counts"]["num_cuda_graph_launches"] for r in truth["ranks"])
    assert launches > 0
    graph_kernels = con.execute("SELECT sum(num_graph_kernels) FROM kernels_classes WHERE run_id = ?", [run_id]).fetchone()[0]
    assert graph_kernels == 3 * launches  # each grad-norm graph replay launches 3 kernels


def test_roofline_finds_the_planted_gemm_efficiency(bf16):
    con, run_id, _ = bf16
    rows = con.execute("SELECT name, bound, peak_frac FROM kernels_roofline WHERE run_id = ? AND name = 'aten::mm'",
                       [run_id]).fetchall()
    assert rows
    for name, bound, peak_frac in rows[:3]:  # the largest GEMMs: long enough that launch floors do not matter
        assert bound == "compute"
        assert peak_frac == pytest.approx(GEMM_EFF, abs=0.03)


def test_fp8_run_divides_by_the_bf16_peak_and_says_so(fp8):
    con, run_id, _ = fp8
    dtypes = {d for (d,) in con.execute("SELECT DISTINCT matmul_dtype FROM kernels_flops WHERE run_id = ?", [run_id]).fetchall()}
    assert dtypes == {"fp8"}
    [(evidence, detail)] = con.execute(
        "SELECT evidence, detail FROM findings WHERE run_id = ? AND title LIKE 'MFU and HFU divide by%'", [run_id]).fetchall()
    evidence = json.loads(evidence)
    assert (evidence["dtype"], evidence["denominator_dtype"]) == ("fp8", "bf16")
    assert evidence["peak_flops_per_s"] == pytest.approx(989e12, rel=0.01)  # H100 SXM dense bf16
    assert "fp8 dense peak" in detail
    fp8_time = con.execute("SELECT sum(dur_ns) FROM kernels_ops WHERE run_id = ? AND dtype = 'fp8'", [run_id]).fetchone()[0]
    assert fp8_time > 0
    quantize = con.execute("SELECT sum(num_events) FROM kernels_classes WHERE run_id = ? AND fine_class = 'quantize'",
                           [run_id]).fetchone()[0]
    assert quantize > 0
