"""FLOP and byte models against torch.utils.flop_counter: ops recorded by torch.profiler (the
trace's own Input Dims/types/Concrete Inputs) must sum, over the leaf ops, to FlopCounterMode's
count of the same work; the hard-coded argument positions match torch's op schemas."""

from __future__ import annotations

import json

import pytest

from bprof.kernels import costs
from bprof.kernels.classify import classify
from bprof.kernels.costs import FLOP_LEAF_OPS, FLOP_NONLEAF_OPS, MATMUL_CLASS_OPS, Cost, op_cost

from .traces import ROOT, cpu_op_events, shared_trace

torch = pytest.importorskip("torch")
F = torch.nn.functional
A = torch.ops.aten


def traced_ops(fn, tmp_path) -> list[dict]:
    """cpu_op events of fn() as a Kineto trace file records them (record_shapes=True)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        fn()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("cat") == "cpu_op"]


def cost_of(event: dict) -> Cost | None:
    a = event["args"]
    return op_cost(event["name"], a.get("Input Dims"), a.get("Input type"), a.get("Concrete Inputs"))


def torch_flops(fn) -> dict[str, int]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return {str(op).replace("aten.", "aten::"): n for op, n in counter.get_flop_counts()["Global"].items()}


def leaf_flops(events) -> dict[str, float]:
    out: dict[str, float] = {}
    for e in events:
        if e["name"] in FLOP_LEAF_OPS:
            c = cost_of(e)
            assert c is not None, (e["name"], e["args"].get("Input Dims"), e["args"].get("Concrete Inputs"))
            out[e["name"]] = out.get(e["name"], 0.0) + c.flops
    return out


def cpu_training_work():
    torch.manual_seed(0)
    lin3, lin2 = torch.nn.Linear(32, 16), torch.nn.Linear(16, 8, bias=False)
    x = torch.randn(4, 7, 32, requires_grad=True)
    y = lin2(lin3(x).relu().reshape(28, 16))
    z = torch.bmm(torch.randn(3, 4, 5, requires_grad=True), torch.randn(3, 5, 6))
    z = torch.baddbmm(torch.randn(3, 4, 2), z, torch.randn(3, 6, 2), beta=0.5, alpha=2.0)
    m = torch.matmul(torch.randn(3, 1, 4, 5), torch.randn(2, 5, 6, requires_grad=True))
    w = torch.randn(8, 3, 3, 3, requires_grad=True)
    img = torch.randn(2, 3, 17, 15, requires_grad=True)
    c = F.conv2d(img, w, torch.randn(8), stride=2, padding=1)
    c2 = F.conv2d(c, torch.randn(8, 8, 3, 3, requires_grad=True), stride=(1, 2), padding=(2, 1), dilation=2)
    c3 = F.conv1d(torch.randn(2, 4, 20, requires_grad=True), torch.randn(6, 4, 5), padding=2)
    t = F.conv_transpose2d(torch.randn(2, 3, 5, 6, requires_grad=True), torch.randn(3, 4, 3, 3), stride=2,
                           padding=1, output_padding=1)
    with torch.no_grad():  # grouped: forward only (see test_grouped_convolution_backward)
        F.conv2d(torch.randn(2, 6, 9, 9), torch.randn(4, 3, 3, 3), groups=2)
    loss = y.sum() + z.sum() + m.sum() + c2.sum() + c3.sum() + t.sum()
    loss.backward()


def test_cpu_training_step_leaf_flops_equal_flop_counter(tmp_path):
    events = traced_ops(cpu_training_work, tmp_path)
    want = torch_flops(cpu_training_work)
    got = leaf_flops(events)
    assert got == pytest.approx({k: float(v) for k, v in want.items()})
    assert {"aten::addmm", "aten::mm", "aten::bmm", "aten::baddbmm", "aten::convolution",
            "aten::convolution_backward"} <= set(got)


def test_parents_and_children_cost_what_their_leaves_cost(tmp_path):
    """A modelled non-leaf op (linear, matmul, conv2d, mkldnn_convolution...) equals the leaves
    nested in it (or that it is nested in): counting leaves alone loses nothing."""
    events = [e for e in traced_ops(cpu_training_work, tmp_path) if e.get("ph") == "X"]
    checked = set()
    for e in events:
        if e["name"] not in FLOP_NONLEAF_OPS or cost_of(e) is None:
            continue
        end = e["ts"] + e["dur"]
        related = [o for o in events if o["name"] in FLOP_LEAF_OPS and o["tid"] == e["tid"]
                   and (e["ts"] <= o["ts"] and o["ts"] + o["dur"] <= end
                        or o["ts"] <= e["ts"] and end <= o["ts"] + o["dur"])]
        assert related, e["name"]
        assert cost_of(e).flops == sum(cost_of(o).flops for o in related), e["name"]
        checked.add(e["name"])
    assert {"aten::linear", "aten::matmul", "aten::conv2d", "aten::conv1d", "aten::_convolution"} <= checked


def meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, device="meta", dtype=dtype)


def cuda_only_work():
    """The CUDA attention and fp8 ops, on meta tensors (shapes only): Sq != Sk, Dv != Dqk."""
    b, h, sq, sk, d = 2, 4, 128, 256, 64
    q, k, v = meta(b, h, sq, d), meta(b, h, sk, d), meta(b, h, sk, d)
    o = A._scaled_dot_product_flash_attention(q, k, v, 0.0, False)
    A._scaled_dot_product_flash_attention_backward(meta(b, h, sq, d), q, k, v, o[0], o[1], o[2], o[3], o[4], o[5],
                                                   0.0, False, o[6], o[7])
    v32 = meta(b, h, sk, 32)
    e = A._scaled_dot_product_efficient_attention(q, k, v32, None, True, 0.0, False)
    A._scaled_dot_product_efficient_attention_backward(meta(b, h, sq, 32), q, k, v32, None, e[0], e[1], e[2], e[3],
                                                       0.0, [True, True, True, False], False)
    c = A._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, False, False)
    A._scaled_dot_product_cudnn_attention_backward(meta(b, h, sq, d), q, k, v, c[0], c[1], c[6], c[7], None, c[2],
                                                   c[3], c[4], c[5], 0.0, False)
    a8 = meta(32, 64, dtype=torch.float8_e4m3fn)
    b8 = meta(16, 64, dtype=torch.float8_e4m3fn).t()
    one = meta((), dtype=torch.float32)
    A._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)


def test_cuda_attention_and_fp8_ops_equal_flop_counter(tmp_path):
    events = traced_ops(cuda_only_work, tmp_path)
    want = torch_flops(cuda_only_work)
    assert len(want) == 7
    assert leaf_flops(events) == pytest.approx({k: float(v) for k, v in want.items()})
    [mm] = [cost_of(e) for e in events if e["name"] == "aten::_scaled_mm"]
    assert mm.dtype == "fp8"
    assert mm.bytes == 32 * 64 + 64 * 16 + 2 * 4 + 32 * 16 * 2  # fp8 operands, fp32 scales, bf16 out


@pytest.mark.parametrize("causal", [False, True])
def test_cpu_sdpa_matches_torch_formula_and_halves_when_causal(tmp_path, causal):
    from torch.utils.flop_counter import sdpa_backward_flop_count, sdpa_flop_count

    q = torch.randn(2, 3, 16, 8, requires_grad=True)
    kv = torch.randn(2, 3, 16, 8, requires_grad=True)
    events = traced_ops(lambda: F.scaled_dot_product_attention(q, kv, kv, is_causal=causal).sum().backward(),
                        tmp_path)
    by_name = {e["name"]: cost_of(e) for e in events}
    fwd = by_name["aten::_scaled_dot_product_flash_attention_for_cpu"]
    bwd = by_name["aten::_scaled_dot_product_flash_attention_for_cpu_backward"]
    scale = 0.5 if causal else 1.0
    assert fwd.flops == scale * sdpa_flop_count(q.shape, kv.shape, kv.shape)
    assert bwd.flops == scale * sdpa_backward_flop_count(q.shape, q.shape, kv.shape, kv.shape)
    assert bwd.flops == 2.5 * fwd.flops and fwd.dtype == "fp32"
    assert by_name["aten::scaled_dot_product_attention"].flops == fwd.flops  # the parent agrees


def test_flash_and_efficient_children_read_bshd(tmp_path):
    b, h, s, d = 2, 4, 96, 64
    q = meta(b, s, h, d)  # _flash_attention_forward takes (batch, seq, heads, dim)

    def work():
        A._flash_attention_forward(q, q, q, None, None, s, s, 0.0, True, False)
        A._scaled_dot_product_flash_attention(meta(b, h, s, d), meta(b, h, s, d), meta(b, h, s, d), 0.0, True)

    by_name = {e["name"]: cost_of(e) for e in traced_ops(work, tmp_path)}
    child, middle = by_name["aten::_flash_attention_forward"], by_name["aten::_scaled_dot_product_flash_attention"]
    assert child.flops == middle.flops == 4 * b * h * s * s * d / 2  # causal
    dims = [[b, s, h, d]] * 3 + [[]] * 6
    types = ["c10::BFloat16"] * 3 + ["", "", "Scalar", "Scalar", "Scalar", "Scalar"]
    efficient = op_cost("aten::_efficient_attention_forward", dims, types, [""] * 9 + ["1"])
    assert efficient.flops == child.flops  # custom_mask_type 1: causal
    packed = op_cost("aten::_flash_attention_forward", [[b * s, h, d]] * 3, ["c10::BFloat16"] * 3)
    assert packed is None  # variable-length batch: sequence lengths are not in the trace


def test_grouped_convolution_backward_counts_each_group_once():
    """torch's flop counter ignores groups for the weight gradient (it counts g times too much);
    here both gradients cost the forward's 2 * N * Cout * HWout * Cin/g * k*k."""
    dims = [[2, 4, 7, 7], [2, 6, 9, 9], [4, 3, 3, 3], [], [], [], [], [], [], [], []]
    types = ["float"] * 3 + ["ScalarList"] * 4 + ["Scalar", "ScalarList", "Scalar", "ScalarList"]
    concrete = ["", "", "", "[4]", "[1, 1]", "[0, 0]", "[1, 1]", "False", "[0, 0]", "2", "[True, True, False]"]
    forward = 2 * 2 * 4 * 49 * 3 * 9
    assert op_cost("aten::convolution_backward", dims, types, concrete).flops == 2 * forward
    concrete[-1] = "[False, True, False]"
    assert op_cost("aten::convolution_backward", dims, types, concrete).flops == forward


def test_matmul_by_hand():
    c = op_cost("aten::addmm", [[512], [64, 128], [128, 512], [], []],
                ["c10::BFloat16"] * 3 + ["Scalar", "Scalar"], ["", "", "", "1", "1"])
    assert c == Cost(2 * 64 * 128 * 512, 2 * (512 + 64 * 128 + 128 * 512 + 64 * 512), "bf16")
    assert op_cost("aten::mm", [[64, 128], [128, 512]], ["float", "float"]).flops == 2 * 64 * 128 * 512
    assert op_cost("aten::bmm", [[3, 4, 5], [3, 5, 6]], ["float"] * 2).flops == 2 * 3 * 4 * 5 * 6
    assert op_cost("aten::linear", [[4, 7, 32], [16, 32], [16]], ["float"] * 3).flops == 2 * 28 * 32 * 16
    assert op_cost("aten::matmul", [[32], [32]], ["float"] * 2).flops == 64  # dot


@pytest.mark.parametrize("name, dims, types, concrete", [
    ("aten::mm", [[64, 128], [127, 512]], ["float"] * 2, None),         # inner dims differ
    ("aten::mm", [[64, 128]], ["float"], None),                         # one operand
    ("aten::mm", [[2, 64, 128], [2, 128, 512]], ["float"] * 2, None),   # mm is 2-D
    ("aten::mm", [[64, 128], [128, 512]], None, None),                  # no types: no bytes
    ("aten::mm", None, None, None),
    ("aten::addmm", [[64, 128], [128, 512], [512], [], []], ["float"] * 3 + ["Scalar"] * 2, None),  # bias not first
    ("aten::bmm", [[3, 4, 5], [2, 5, 6]], ["float"] * 2, None),         # batch differs
    ("aten::add", [[4], [4]], ["float"] * 2, None),                     # not modelled
    # legacy trace (torch 1.8): no Concrete Inputs, so no stride/padding: output size unknown
    ("aten::convolution", [[32, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], [], [], []],
     ["float", "float", "", "GenericList", "GenericList", "GenericList", "Bool", "GenericList", "Int"], None),
    ("aten::_scaled_dot_product_flash_attention", [[2, 4, 16, 8], [2, 4, 16, 4], [2, 4, 16, 8]],
     ["float"] * 3, None),                                               # q and k head dims differ
])
def test_missing_or_inconsistent_shapes_give_none(name, dims, types, concrete):
    assert op_cost(name, dims, types, concrete) is None


def test_real_traced_matmuls_get_costs():
    """Every aten::mm/addmm/bmm of the real traces with shapes gets the FLOPs FlopCounterMode counts."""
    checked = 0
    for folder in ("a100_ws16_rank0", "mi250_rocm_minitoy", "v100_resnet50_legacy_2021"):
        path = next(shared_trace(folder).iterdir())
        for e in cpu_op_events(path, {"aten::mm", "aten::addmm", "aten::bmm"}):
            if not e.get("args", {}).get("Input Dims"):
                continue
            c = cost_of(e)
            assert c is not None, (folder, e["args"])
            dims = [d for d, t in zip(e["args"]["Input Dims"], e["args"]["Input type"]) if t == "float" and d]
            want = torch_flops(lambda: getattr(A, e["name"][6:])(*[meta(*d, dtype=torch.float32) for d in dims]))
            assert c.flops == want[e["name"]]
            checked += 1
    assert checked >= 3


DEMO = ROOT / "runs" / "demo" / "record" / "traces"


def test_recorded_cpu_run_matmuls_and_attention():
    traces = sorted(DEMO.glob("iteration_*/*.json.gz")) if DEMO.exists() else []
    if not traces:
        pytest.skip(f"no recorded demo run at {DEMO} (make demo writes one)")
    events = cpu_op_events(traces[0], {"aten::addmm", "aten::mm", "aten::_scaled_dot_product_flash_attention_for_cpu"})
    assert events
    for e in events:
        c, (dims, types) = cost_of(e), (e["args"]["Input Dims"], e["args"]["Input type"])
        assert c is not None and c.dtype == "fp32"
        if e["name"] == "aten::mm":
            (m, k), (_, n) = dims[:2]
        elif e["name"] == "aten::addmm":
            (m, k), (_, n) = dims[1:3]
        else:  # causal (Concrete Inputs "True"): half of 4 * B * H * S * S * D
            b, h, s, d = dims[0]
            assert e["args"]["Concrete Inputs"][4] == "True" and c.flops == 2 * b * h * s * s * d
            continue
        assert c.flops == 2 * m * k * n


def test_leaf_sets():
    assert not FLOP_LEAF_OPS & FLOP_NONLEAF_OPS
    assert MATMUL_CLASS_OPS <= FLOP_LEAF_OPS
    assert FLOP_LEAF_OPS | FLOP_NONLEAF_OPS == set(costs._MODELS)
    for name in FLOP_LEAF_OPS | FLOP_NONLEAF_OPS:
        assert classify(name, "cpu_op").fine_class in ("gemm", "attention"), name


def schema_args(name: str) -> list[str]:
    op = getattr(A, name.split("::")[1]).default
    return [arg.name for arg in op._schema.arguments]


@pytest.mark.parametrize("name", sorted(n for n in costs._ATTN if n.startswith("aten::")))
def test_attention_argument_positions_match_torch_schema(name):
    spec, args = costs._ATTN[name], schema_args(name)
    assert [args[spec.q], args[spec.k], args[spec.v]] == ["query", "key", "value"]
    if spec.grad is not None:
        assert args[spec.grad] in ("grad_out", "grad_out_")
    if spec.causal is not None:
        assert args[spec.causal] == "is_causal"
    if spec.mask_type is not None:
        assert args[spec.mask_type] == "custom_mask_type"
    if spec.varlen is not None:
        assert args[spec.varlen] in ("cum_seq_q", "cu_seqlens_q")


def test_convolution_argument_positions_match_torch_schema():
    assert schema_args("aten::convolution")[3:9] == ["stride", "padding", "dilation", "transposed",
                                                      "output_padding", "groups"]
    assert schema_args("aten::_convolution")[3:9] == schema_args("aten::convolution")[3:9]
    assert schema_args("aten::conv2d")[3:7] == ["stride", "padding", "dilation", "groups"]
    assert schema_args("aten::mkldnn_convolution")[2:7] == ["bias", "padding", "stride", "dilation", "groups"]
    assert schema_args("aten::cudnn_convolution")[2:6] == ["padding", "stride", "dilation", "groups"]
    assert schema_args("aten::convolution_backward")[7] == "transposed"
    assert schema_args("aten::convolution_backward")[10] == "output_mask"
    assert schema_args("aten::_scaled_mm")[6] == "out_dtype"
    assert schema_args("aten::addmm")[:3] == ["self", "mat1", "mat2"]
