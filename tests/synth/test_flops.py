"""Planted FLOPs: truth.json's per-step executed FLOPs and matmul kernel time equal a recount from
the written shapes (own formulas here, never bprof.kernels), attention ops carry torch's argument
lists, and the fp8 scenario runs its linears as _scaled_mm on e4m3 operands."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from bprof.kernels.classify import classify
from bprof.synth import Scenario, write_run
from tests.synth.read import Timeline, by_thread, dur_ns, interval, raw

SDPA = "aten::_scaled_dot_product_flash_attention"
SDPA_BWD = "aten::_scaled_dot_product_flash_attention_backward"
LEAVES = {"aten::mm", "aten::_scaled_mm", "aten::bmm", "aten::baddbmm", SDPA, SDPA_BWD}
# Ops that hold matmul work but are parents or children of a leaf above (never counted).
NOT_LEAVES = {"aten::linear", "aten::scaled_dot_product_attention",
              "aten::_flash_attention_forward", "aten::_flash_attention_backward"}
FP8 = "c10::Float8_e4m3fn"
H100_BF16_DENSE_FLOPS = 989e12


def leaf_flops(e) -> int:
    """FLOPs of one leaf op from its Input Dims (one multiply-add = 2; causal attention halved)."""
    name, dims = e["name"], e["args"]["Input Dims"]
    concrete = e["args"].get("Concrete Inputs")
    if name in ("aten::mm", "aten::_scaled_mm"):
        (m, k), (k2, n) = dims[0], dims[1]
        assert k == k2, e
        return 2 * m * k * n
    if name in ("aten::bmm", "aten::baddbmm"):
        (bt, m, k), (bt2, k2, n) = dims[0:2] if name == "aten::bmm" else dims[1:3]
        assert bt == bt2 and k == k2, e
        return 2 * bt * m * k * n
    q, key, causal_at = (dims[0], dims[1], 4) if name == SDPA else (dims[1], dims[2], 11)
    (b, h, sq, d), sk = q, key[2]
    per = 4 if name == SDPA else 10  # QK^T + PV; backward recomputes QK^T and runs four more
    flops = per * b * h * sq * sk * d
    return flops // 2 if concrete[causal_at] == "True" else flops


def _steps(trace):
    return sorted(interval(trace, e) for e in trace["traceEvents"]
                  if e.get("name", "").startswith("ProfilerStep#"))


def _step_of(steps, t):
    [i] = [i for i, (s, e) in enumerate(steps) if s <= t <= e]
    return i


def recount_flops(trace) -> tuple[list[int], set[str]]:
    steps = _steps(trace)
    flops, seen = [0] * len(steps), set()
    for e in trace["traceEvents"]:
        if e.get("cat") != "cpu_op":
            continue
        if e["name"] in LEAVES:
            flops[_step_of(steps, interval(trace, e)[0])] += leaf_flops(e)
            seen.add(e["name"])
        else:  # nothing else may carry matmul work the truth would miss
            assert not re.search(r"mm\b|attention", e["name"]) or e["name"] in NOT_LEAVES, e
    return flops, seen


def matmul_kernels(trace):
    """(kernel, launching cpu op) for the kernels that execute leaf FLOPs (modern: External id)."""
    ops = {e["args"]["External id"]: e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    out = []
    for k in trace["traceEvents"]:
        if k.get("cat") != "kernel":
            continue
        op = ops.get(k["args"]["External id"])
        name = op["name"] if op else ""
        if (name in LEAVES or name == "aten::_flash_attention_forward"
                or (name == "aten::_flash_attention_backward" and "dq_dk_dv" in k["name"])):
            out.append((k, op))
    return out


@pytest.fixture(scope="module", params=["modern", "2022", "fp8"])
def flops_run(request, modern_run, old_run, fp8_run):
    return {"modern": modern_run, "2022": old_run, "fp8": fp8_run}[request.param]


def test_truth_flops_equal_a_recount_from_the_written_shapes(flops_run):
    want = {"modern": {"aten::mm", SDPA, SDPA_BWD},
            "2022": {"aten::mm", "aten::bmm", "aten::baddbmm"},
            "fp8": {"aten::mm", "aten::_scaled_mm", SDPA, SDPA_BWD}}
    kind = flops_run.sc.compute_dtype if flops_run.sc.compute_dtype == "fp8" else flops_run.sc.fmt
    names = set()
    for r in flops_run.truth["ranks"]:
        flops, seen = recount_flops(flops_run.traces[r["rank"]])
        assert r["step_executed_flops"] == flops and len(flops) == len(r["steps"])
        assert min(flops) > 0
        names |= seen
    assert names == want[kind]


@pytest.mark.parametrize("run", ["modern_run", "fp8_run"])  # 2022: External id = correlation
def test_truth_matmul_kernel_time_equals_the_written_kernels(run, request):
    flops_run = request.getfixturevalue(run)
    jitter = flops_run.sc.clock_jitter_ns
    for r in flops_run.truth["ranks"]:
        trace = flops_run.traces[r["rank"]]
        steps = _steps(trace)
        got, count = [0] * len(steps), 0
        for k, op in matmul_kernels(trace):
            got[_step_of(steps, interval(trace, op)[0])] += dur_ns(k["dur"])
            count += 1
        assert count > 0
        # A written duration is off by the wander's change over it: slope <= 2*pi*jitter/40 ms
        # (clock.py), plus 1 ns of rounding at each end.
        slope = 2 * math.pi * jitter / 40e6
        for g, want, compute in zip(got, r["step_matmul_kernel_ns"], r["step_compute_kernel_ns"]):
            assert abs(g - want) <= want * slope + 2 * count
            assert 0 < want < compute


def test_attention_ops_carry_torch_argument_lists(modern_run):
    sc = modern_run.sc
    b, h, s, d = sc.micro_batch_size, sc.heads // sc.tp, sc.seq_len, sc.hidden // sc.heads
    trace = modern_run.traces[0]
    cpu = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    fwd = {e["name"]: e["args"] for e in cpu if "flash_attention" in e["name"]}
    assert set(fwd) == {SDPA, SDPA_BWD, "aten::_flash_attention_forward",
                        "aten::_flash_attention_backward"}
    assert fwd[SDPA]["Input Dims"][0] == fwd[SDPA_BWD]["Input Dims"][1] == [b, h, s, d]
    bwd = fwd[SDPA_BWD]
    assert len(bwd["Input Dims"]) == 15 and bwd["Concrete Inputs"][11] == "True"
    assert bwd["Input Dims"][0] == bwd["Input Dims"][4] == [b, h, s, d]  # grad_out, out
    assert bwd["Input Dims"][5] == [b, h, s] and bwd["Input type"][5] == "float"  # logsumexp
    # The flash kernels' ops take query.transpose(1, 2): (batch, seq, heads, dim), not contiguous.
    for name, n_args, causal_at in (("aten::_flash_attention_forward", 13, 8),
                                    ("aten::_flash_attention_backward", 17, 11)):
        a = fwd[name]
        assert len(a["Input Dims"]) == n_args and a["Concrete Inputs"][causal_at] == "True"
        assert a["Input Dims"][1] == [b, s, h, d]
        assert a["Input Strides"][1] == [h * s * d, d, s * d, 1]
    attn = [e for e in cpu if e["name"] in (SDPA, SDPA_BWD)]
    per = {n: sum(leaf_flops(e) for e in attn if e["name"] == n) for n in (SDPA, SDPA_BWD)}
    assert per[SDPA_BWD] * 2 == per[SDPA] * 5  # backward = 2.5 x forward, both causal


def test_fp8_linears_run_as_scaled_mm_on_e4m3_operands(fp8_run):
    t, sc = fp8_run.truth, fp8_run.sc
    assert t["scenario"]["dtype"] == t["scenario"]["compute_dtype"] == "fp8"
    lm_n = sc.vocab // sc.tp
    for r in t["ranks"]:
        trace = fp8_run.traces[r["rank"]]
        cpu = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
        scaled = [e["args"] for e in cpu if e["name"] == "aten::_scaled_mm"]
        assert scaled
        for a in scaled:
            assert a["Input type"] == [FP8, FP8, "float", "float", "", "", "Scalar", "Scalar"]
            assert a["Concrete Inputs"][6] == "15"  # out_dtype BFloat16
            assert a["Input Strides"][1] == [1, a["Input Dims"][1][0]]  # mat2 column-major
        # bf16 matmuls are the LM head's only, on the last stage
        mms = [e["args"] for e in cpu if e["name"] == "aten::mm"]
        assert bool(mms) == (r["pp_stage"] == sc.pp - 1)
        for a in mms:
            assert a["Input type"][:2] == ["c10::BFloat16"] * 2
            assert lm_n in a["Input Dims"][0] + a["Input Dims"][1]
        # each fp8 backward casts grad_output once, then runs dgrad and wgrad
        threads = by_thread(trace, ("cpu_op",))
        main, autograd = (threads[(r["pid"], r["tids"][t])] for t in ("main", "autograd"))
        line = Timeline(trace, autograd)
        grads = [e for e in autograd if e["name"] == "Fp8LinearBackward"]
        assert grads
        for g in grads:
            inner = [e["name"] for e in line.inside(*interval(trace, g)) if e is not g]
            assert inner == ["tex_ts::cast_to_fp8_ts", "aten::_scaled_mm", "aten::_scaled_mm"]
        casts = [e for e in main if e["name"] == "tex_ts::cast_to_fp8_ts"]
        fwd = [e for e in main if e["name"] == "aten::_scaled_mm"]
        assert len(casts) == 2 * len(fwd) > 0  # input and weight per forward GEMM


def test_fp8_kernels_are_gemms_after_quantize_casts_and_beat_the_bf16_peak(fp8_run):
    trace = fp8_run.traces[0]
    ops = {e["args"]["External id"]: e["name"] for e in trace["traceEvents"]
           if e.get("cat") == "cpu_op"}
    fine = {}
    for k in trace["traceEvents"]:
        if k.get("cat") == "kernel" and ops.get(k["args"]["External id"]) in (
                "aten::_scaled_mm", "tex_ts::cast_to_fp8_ts"):
            fine.setdefault(ops[k["args"]["External id"]], set()).add(
                classify(k["name"], "kernel").fine_class)
    assert fine == {"aten::_scaled_mm": {"gemm"}, "tex_ts::cast_to_fp8_ts": {"quantize"}}
    pairs = [(k, op) for k, op in matmul_kernels(trace) if op["name"] == "aten::_scaled_mm"]
    flops = sum(leaf_flops(op) for _, op in pairs)
    seconds = sum(dur_ns(k["dur"]) for k, _ in pairs) * 1e-9
    assert flops / seconds > H100_BF16_DENSE_FLOPS  # only an fp8 GEMM is this fast on an H100


def test_fp8_needs_a_modern_hopper_trace():
    with pytest.raises(ValueError, match="fp8"):
        Scenario(dtype="fp8")  # A100
    with pytest.raises(ValueError, match="fp8"):
        Scenario(dtype="fp8", device="H100", fmt="2022")


def test_same_seed_fp8_run_gives_identical_bytes(tmp_path):
    from tests.synth.conftest import FP8
    sc = replace(FP8, steps=1, layers=2, dp=1)
    write_run(sc, tmp_path / "a")
    write_run(sc, tmp_path / "b")
    for p in sorted((tmp_path / "a").iterdir()):
        assert raw(p) == raw(tmp_path / "b" / p.name), p.name
        assert p.read_bytes() == (tmp_path / "b" / p.name).read_bytes()
