"""FLOPs and minimum bytes of a CPU op from its recorded shapes (record_shapes=True): matmuls,
convolutions and attention, with torch.utils.flop_counter's conventions (one multiply-add = 2 FLOPs).

Bytes are the minimum-traffic model: every input tensor read once and every output written once.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass

from bprof.kernels.devices import normalize_dtype


@dataclass(frozen=True)
class Cost:
    flops: float
    bytes: float
    dtype: str | None  # normalised dtype of the main operands ('bf16', 'fp8', ...), see devices.normalize_dtype


# Which ops are counted. A traced aten::linear is the parent of an aten::addmm (or of aten::matmul
# and then aten::mm), aten::conv2d of aten::convolution, which is the parent of
# aten::cudnn_convolution, and aten::_scaled_dot_product_flash_attention the parent of
# aten::_flash_attention_forward. Summing op_cost over FLOP_LEAF_OPS counts each FLOP once: the
# leaf is the one level present on every backend (CPU, CUDA, ROCm). FLOP coverage is computed over
# MATMUL_CLASS_OPS, which are leaves only: covered = their time whose op_cost is not None, over
# their whole time. op_cost also models the parents and children below (FLOP_NONLEAF_OPS) for
# drill-down, but they never enter a sum.
_ATTENTION_LEAVES = frozenset({
    "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_flash_attention_backward",
    "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_efficient_attention_backward",
    "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_cudnn_attention_backward",
    "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
    "flashattn::_flash_attn_forward", "flashattn::_flash_attn_backward",  # flash-attn >= 2.6 custom ops
    "flash_attn::_flash_attn_forward", "flash_attn::_flash_attn_backward",
})
FLOP_LEAF_OPS: frozenset[str] = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm",
    "aten::convolution", "aten::convolution_backward",
}) | _ATTENTION_LEAVES
MATMUL_CLASS_OPS: frozenset[str] = FLOP_LEAF_OPS
FLOP_NONLEAF_OPS: frozenset[str] = frozenset({
    "aten::linear", "aten::matmul", "aten::scaled_dot_product_attention",
    "aten::conv1d", "aten::conv2d", "aten::conv3d", "aten::_convolution", "aten::cudnn_convolution",
    "aten::mkldnn_convolution",
    "aten::_flash_attention_forward", "aten::_flash_attention_backward",
    "aten::_efficient_attention_forward", "aten::_efficient_attention_backward",
})

_INT_BYTES = {"long int": 8, "long": 8, "int64_t": 8, "int": 4, "short int": 2, "short": 2,
              "unsigned char": 1, "signed char": 1, "bool": 1}
_FLOAT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8, "fp8": 1, "int8": 1}
# c10::ScalarType codes, as a traced out_dtype argument shows them (Concrete Inputs "15" = BFloat16)
_SCALAR_TYPE_BYTES = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2, 23: 1, 24: 1, 25: 1, 26: 1}


def elem_bytes(traced_type: str) -> int | None:
    """Bytes per element of a traced tensor type ('float', 'c10::BFloat16', 'long int'); None if not a tensor type."""
    short = normalize_dtype(traced_type)
    if short in _FLOAT_BYTES:
        return _FLOAT_BYTES[short]
    return _INT_BYTES.get(str(traced_type).strip())


class _Args:
    """One op's recorded arguments, positionally; any malformed part reads as missing."""

    def __init__(self, dims, types, concrete):
        self.dims = dims if isinstance(dims, list) else []
        self.types = types if isinstance(types, list) else []
        self.concrete = concrete if isinstance(concrete, list) else []

    def __len__(self):
        return len(self.dims)

    def shape(self, i: int) -> list[int] | None:
        """Shape of tensor argument i; None when absent, not a tensor or not all positive ints."""
        if i >= len(self.dims) or i >= len(self.types) or elem_bytes(self.types[i]) is None:
            return None
        d = self.dims[i]
        if not isinstance(d, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in d):
            return None
        return d

    def tensor_bytes(self, i: int) -> float:
        shape = self.shape(i)
        return 0.0 if shape is None else float(math.prod(shape) * elem_bytes(self.types[i]))

    def elem(self, i: int) -> int | None:
        return elem_bytes(self.types[i]) if i < len(self.types) else None

    def dtype(self, i: int) -> str | None:
        return normalize_dtype(self.types[i]) if i < len(self.types) else None

    def value(self, i: int):
        """Concrete input i parsed as a Python literal (True, 3, [1, 1], 0.5); None when absent."""
        if i >= len(self.concrete) or not isinstance(self.concrete[i], str) or not self.concrete[i]:
            return None
        text = self.concrete[i].strip()
        if text in ("True", "False"):
            return text == "True"
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text

    def flag(self, i: int) -> bool | None:
        v = self.value(i)
        return v if isinstance(v, bool) else None

    def ints(self, i: int, n: int) -> list[int] | None:
        """An int-list argument expanded to n spatial dims ([2] -> [2, 2]); None when unknown."""
        v = self.value(i)
        if isinstance(v, int) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            return None
        if len(v) == 1:
            return v * n
        return v if len(v) == n else None


def op_cost(name: str, input_dims, input_types, concrete_inputs=None) -> Cost | None:
    """FLOPs, bytes and dtype of one traced op; None when the op is not modelled or its shapes are
    missing or inconsistent (never a guess)."""
    model = _MODELS.get(name)
    if model is None:
        return None
    return model(_Args(input_dims, input_types, concrete_inputs))


# --- matmuls ---------------------------------------------------------------------------------


def _matmul(a: _Args, rank: int, ia: int, ib: int, extra=(), out_elem: int | None = None) -> Cost | None:
    """[M, K] x [K, N] (rank 2) or [B, M, K] x [B, K, N] (rank 3): mm, bmm and their add variants."""
    x, y = a.shape(ia), a.shape(ib)
    if x is None or y is None or len(x) != rank or len(y) != rank or x[:-2] != y[:-2] or x[-1] != y[-2]:
        return None
    batch, (m, k), n = math.prod(x[:-2]), x[-2:], y[-1]
    out = batch * m * n * (out_elem or a.elem(ia))
    read = a.tensor_bytes(ia) + a.tensor_bytes(ib) + sum(a.tensor_bytes(i) for i in extra)
    return Cost(2.0 * batch * m * k * n, read + out, a.dtype(ia))


def _mm(a):
    return _matmul(a, 2, 0, 1)


def _bmm(a):
    return _matmul(a, 3, 0, 1)


def _addmm(a):  # (bias, mat1, mat2, beta, alpha): the bias comes first
    return _matmul(a, 2, 1, 2, extra=(0,))


def _baddbmm(a):  # (self, batch1, batch2, beta, alpha)
    return _matmul(a, 3, 1, 2, extra=(0,))


def _scaled_mm(a):  # (mat1, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)
    code = a.value(6)
    out_elem = _SCALAR_TYPE_BYTES.get(code) if isinstance(code, int) else None
    return _matmul(a, 2, 0, 1, extra=(2, 3, 4, 5), out_elem=out_elem)


def _broadcast(p: list[int], q: list[int]) -> list[int] | None:
    out = []
    for i in range(1, max(len(p), len(q)) + 1):
        x = p[-i] if i <= len(p) else 1
        y = q[-i] if i <= len(q) else 1
        if x != y and 1 not in (x, y):
            return None
        out.append(max(x, y))
    return out[::-1]


def _torch_matmul(a):
    """torch.matmul's rules: 1-D operands gain a dim, batch dims broadcast."""
    x, y = a.shape(0), a.shape(1)
    if not x or not y:
        return None
    xm, ym = (x if len(x) > 1 else [1] + x), (y if len(y) > 1 else y + [1])
    batch = _broadcast(xm[:-2], ym[:-2])
    if batch is None or xm[-1] != ym[-2]:
        return None
    (m, k), n = xm[-2:], ym[-1]
    nb = math.prod(batch)
    return Cost(2.0 * nb * m * k * n, a.tensor_bytes(0) + a.tensor_bytes(1) + nb * m * n * a.elem(0), a.dtype(0))


def _linear(a):  # (input [.., K], weight [N, K], bias [N])
    x, w = a.shape(0), a.shape(1)
    if not x or w is None or len(w) != 2 or x[-1] != w[1]:
        return None
    rows = math.prod(x[:-1])
    read = a.tensor_bytes(0) + a.tensor_bytes(1) + a.tensor_bytes(2)
    return Cost(2.0 * rows * w[1] * w[0], read + rows * w[0] * a.elem(0), a.dtype(0))


# --- convolutions ----------------------------------------------------------------------------
# FLOPs = 2 * N * Cout * prod(out spatial) * (Cin / groups) * prod(kernel); a transposed
# convolution counts over its input's spatial points instead (as torch.utils.flop_counter does).


def _conv(a: _Args, stride_i, pad_i, dil_i, transposed, out_pad_i, groups_i, bias_i) -> Cost | None:
    x, w = a.shape(0), a.shape(1)
    if x is None or w is None or len(x) != len(w) or len(x) < 3:
        return None
    n_sp = len(x) - 2
    stride, dil = a.ints(stride_i, n_sp), a.ints(dil_i, n_sp)
    groups = a.value(groups_i) if groups_i is not None else None
    if isinstance(groups, bool):
        groups = None
    pad = a.ints(pad_i, n_sp)
    if stride is None or dil is None or pad is None:  # padding='same' is not recorded: unknown
        return None
    batch, kernel = x[0], w[2:]
    if transposed:
        out_pad = a.ints(out_pad_i, n_sp) if out_pad_i is not None else None
        if out_pad is None or not isinstance(groups, int) or x[1] != w[0]:
            return None
        out_sp = [(i - 1) * s - 2 * p + d * (k - 1) + op + 1
                  for i, s, p, d, k, op in zip(x[2:], stride, pad, dil, kernel, out_pad)]
        c_out = w[1] * groups
        flops = 2.0 * batch * w[0] * w[1] * math.prod(x[2:]) * math.prod(kernel)
    else:
        if groups is None:
            groups = x[1] // w[1] if w[1] and x[1] % w[1] == 0 else None
        if not isinstance(groups, int) or groups < 1 or x[1] != w[1] * groups:
            return None
        out_sp = [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in zip(x[2:], stride, pad, dil, kernel)]
        c_out = w[0]
        flops = 2.0 * batch * c_out * math.prod(out_sp) * w[1] * math.prod(kernel)
    if any(o <= 0 for o in out_sp):
        return None
    read = a.tensor_bytes(0) + a.tensor_bytes(1) + (a.tensor_bytes(bias_i) if bias_i is not None else 0.0)
    return Cost(flops, read + batch * c_out * math.prod(out_sp) * a.elem(0), a.dtype(0))


def _convolution(a):
    # convolution, _convolution: (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...)
    transposed = a.flag(6)
    if transposed is None:
        return None
    return _conv(a, 3, 4, 5, transposed, 7, 8, 2)


def _conv_nd(a):  # conv1d/2d/3d: (input, weight, bias, stride, padding, dilation, groups)
    return _conv(a, 3, 4, 5, False, None, 6, 2)


def _mkldnn_convolution(a):  # (self, weight, bias, padding, stride, dilation, groups): padding before stride
    return _conv(a, 4, 3, 5, False, None, 6, 2)


def _cudnn_convolution(a):
    # current: (self, weight, padding, stride, dilation, groups, benchmark, deterministic, allow_tf32);
    # torch <= 1.7 had a bias tensor third: (self, weight, bias, padding, stride, dilation, groups, ...)
    if a.shape(2) is not None:
        return _conv(a, 4, 3, 5, False, None, 6, 2)
    return _conv(a, 3, 2, 4, False, None, 5, None)


def _convolution_backward(a):
    """(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed, output_padding,
    groups, output_mask): each of grad_input and grad_weight costs the forward's FLOPs."""
    g, x, w = a.shape(0), a.shape(1), a.shape(2)
    mask, transposed = a.value(10), a.flag(7)
    if (g is None or x is None or w is None or len(g) != len(x) or len(x) != len(w) or len(x) < 3
            or not isinstance(mask, list) or len(mask) != 3 or transposed is None or g[0] != x[0]):
        return None
    batch, kernel = x[0], w[2:]
    if transposed:
        if x[1] != w[0]:
            return None
        forward = 2.0 * batch * w[0] * w[1] * math.prod(x[2:]) * math.prod(kernel)
    else:
        if g[1] != w[0] or w[1] == 0 or x[1] % w[1]:
            return None
        forward = 2.0 * batch * w[0] * math.prod(g[2:]) * w[1] * math.prod(kernel)
    read = a.tensor_bytes(0) + a.tensor_bytes(1) + a.tensor_bytes(2)
    written = (a.tensor_bytes(1) if mask[0] else 0.0) + (a.tensor_bytes(2) if mask[1] else 0.0)
    if mask[2]:
        written += g[1] * a.elem(0)
    return Cost(forward * (bool(mask[0]) + bool(mask[1])), read + written, a.dtype(1))


# --- attention -------------------------------------------------------------------------------
# Forward = 2 * B * Hq * Sq * Sk * (Dqk + Dv) (QK^T and PV; 4*B*H*S*S*D when Dqk = Dv); backward
# = 2 * B * Hq * Sq * Sk * (3 * Dqk + 2 * Dv), 2.5x the forward (recomputed QK^T plus four
# matmuls), as torch.utils.flop_counter counts them. Both are halved when the op says it is
# causal (the exact ratio for Sq = Sk is (S + 1) / 2S); when causality is not recorded the full
# count stands, which is torch's convention. Grouped-query attention counts the query heads.


@dataclass(frozen=True)
class _Attn:
    q: int
    k: int
    v: int
    grad: int | None  # grad_out argument: a backward op
    causal: int | None  # bool is_causal argument (None: see mask_type)
    bshd: bool = False  # (batch, seq, heads, dim) layout, as the flash/efficient kernels take it
    mask_type: int | None = None  # _efficient_attention_*: custom_mask_type 0 none, 1/2 causal
    varlen: int | None = None  # cu_seqlens argument: a packed variable-length batch is not modelled


_ATTN = {
    "aten::scaled_dot_product_attention": _Attn(0, 1, 2, None, 5),
    "aten::_scaled_dot_product_flash_attention": _Attn(0, 1, 2, None, 4),
    "aten::_scaled_dot_product_flash_attention_for_cpu": _Attn(0, 1, 2, None, 4),
    "aten::_scaled_dot_product_efficient_attention": _Attn(0, 1, 2, None, 6),
    "aten::_scaled_dot_product_cudnn_attention": _Attn(0, 1, 2, None, 6),
    "aten::_scaled_dot_product_flash_attention_backward": _Attn(1, 2, 3, 0, 11),
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": _Attn(1, 2, 3, 0, 7),
    "aten::_scaled_dot_product_efficient_attention_backward": _Attn(1, 2, 3, 0, 11),
    "aten::_scaled_dot_product_cudnn_attention_backward": _Attn(1, 2, 3, 0, 14),
    "aten::_flash_attention_forward": _Attn(0, 1, 2, None, 8, bshd=True, varlen=3),
    "aten::_flash_attention_backward": _Attn(1, 2, 3, 0, 11, bshd=True, varlen=6),
    "aten::_efficient_attention_forward": _Attn(0, 1, 2, None, None, bshd=True, mask_type=9, varlen=4),
    "aten::_efficient_attention_backward": _Attn(1, 2, 3, 0, None, bshd=True, mask_type=14, varlen=6),
    "flashattn::_flash_attn_forward": _Attn(0, 1, 2, None, 5, bshd=True),
    "flashattn::_flash_attn_backward": _Attn(1, 2, 3, 0, 11, bshd=True),
}
_ATTN["flash_attn::_flash_attn_forward"] = _ATTN["flashattn::_flash_attn_forward"]
_ATTN["flash_attn::_flash_attn_backward"] = _ATTN["flashattn::_flash_attn_backward"]
# _scaled_dot_product_flash_attention.quantized (q, k, v, q/k/v_descale, dropout_p, is_causal, ...)
_SDPA_FLASH_QUANTIZED = _Attn(0, 1, 2, None, 7)


def _attention(spec: _Attn, a: _Args) -> Cost | None:
    q, k, v = a.shape(spec.q), a.shape(spec.k), a.shape(spec.v)
    if q is None or k is None or v is None or not len(q) == len(k) == len(v) == 4:
        return None
    if spec.varlen is not None and a.shape(spec.varlen):
        return None
    if spec.bshd:  # (B, S, H, D) -> (B, H, S, D)
        q, k, v = ([t[0], t[2], t[1], t[3]] for t in (q, k, v))
    (b, hq, sq, dqk), (bk, hk, sk, dk), (bv, hv, sv, dv) = q, k, v
    if not (b == bk == bv and hk == hv and sk == sv and dqk == dk) or hk == 0 or hq % hk:
        return None
    if spec.grad is None:
        flops = 2.0 * b * hq * sq * sk * (dqk + dv)
        written = b * hq * sq * dv * a.elem(spec.q)
    else:
        g = a.shape(spec.grad)
        if g is None or len(g) != 4 or g[0] != b or math.prod(g) != b * hq * sq * dv:
            return None
        flops = 2.0 * b * hq * sq * sk * (3 * dqk + 2 * dv)
        written = a.tensor_bytes(spec.q) + a.tensor_bytes(spec.k) + a.tensor_bytes(spec.v)  # dq, dk, dv
    if spec.mask_type is not None:
        causal = a.value(spec.mask_type) in (1, 2)
    else:
        causal = a.flag(spec.causal) is True
    if causal:
        flops /= 2
    read = sum(a.tensor_bytes(i) for i in range(len(a)))
    return Cost(flops, read + written, a.dtype(spec.q))


def _attention_model(name: str):
    spec = _ATTN[name]
    if name == "aten::_scaled_dot_product_flash_attention":
        return lambda a: _attention(_SDPA_FLASH_QUANTIZED if len(a) == 10 else spec, a)
    return lambda a: _attention(spec, a)


_MODELS = {
    "aten::mm": _mm,
    "aten::addmm": _addmm,
    "aten::bmm": _bmm,
    "aten::baddbmm": _baddbmm,
    "aten::_scaled_mm": _scaled_mm,
    "aten::matmul": _torch_matmul,
    "aten::linear": _linear,
    "aten::convolution": _convolution,
    "aten::_convolution": _convolution,
    "aten::conv1d": _conv_nd,
    "aten::conv2d": _conv_nd,
    "aten::conv3d": _conv_nd,
    "aten::cudnn_convolution": _cudnn_convolution,
    "aten::mkldnn_convolution": _mkldnn_convolution,
    "aten::convolution_backward": _convolution_backward,
    **{name: _attention_model(name) for name in _ATTN},
}
