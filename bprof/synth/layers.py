"""Transformer recipes: which CPU ops launch which kernels, forward, backward and optimizer.

Megatron sequence-first activations [s, b, h]; column-parallel QKV/fc1 and row-parallel
proj/fc2 (TP all-reduce after each row-parallel GEMM in forward and after each column-parallel
dgrad in backward). `b` is a program.RankBuilder. Forward runs on the main thread, backward on the
autograd thread as `autograd::engine::evaluate_function: XBackward0` ⊃ `XBackward0` ⊃ aten ops.
The 2022 format uses the pre-SDPA attention (baddbmm, softmax, bmm). An fp8 run (H100) casts
the operands of the transformer layers' linears with TransformerEngine's cast op and multiplies
them with torch._scaled_mm, forward and backward; attention and the LM head stay bf16.
Every FLOP-carrying kernel gets `flops=`: the FLOPs of the shape-recorded op that launches it,
by the same formula that sizes the kernel (truth.json sums them per step).
"""

from __future__ import annotations

from functools import lru_cache
from math import prod

from .catalog import ATTN_EFF, INPUT_TYPE, gemm_ns, mem_ns
from .ops import BWD, MAIN, TP_STREAM, N, R


def T(dims, dtype, strides=None):
    """A tensor argument; strides default to contiguous."""
    return ("T", tuple(dims), dtype, None if strides is None else tuple(strides))


def S(value):
    return ("S", str(value))


def L(dims):
    return ("L", tuple(dims))


NONE = ("N",)  # None, or an undefined Tensor: both are traced as type "" and dims []
FP8 = "Float8_e4m3fn"
TE_FLOAT8_E4M3 = 6  # transformer_engine DType::kFloat8E4M3, the cast op's otype argument
SCALAR_TYPE_BF16 = 15  # c10::ScalarType::BFloat16: _scaled_mm's out_dtype as traced


def bshd(bs, nh, s, hd, dtype):
    """The (batch, seq, heads, dim) view torch's flash kernels take: query.transpose(1, 2) of a
    contiguous (batch, heads, seq, dim) tensor, so the strides are not contiguous."""
    return T([bs, s, nh, hd], dtype, [nh * s * hd, hd, s * hd, 1])


@lru_cache(maxsize=4096)
def shapes(*inputs):
    """record_shapes args (Input Dims, Input type, Input Strides, Concrete Inputs) of inputs.
    Cached: the same shapes recur every layer, and the lists are only ever serialised."""
    dims, types, strides, concrete = [], [], [], []
    for x in inputs:
        if x[0] == "T":
            st, acc = [], 1
            for n in reversed(x[1]):
                st.append(acc)
                acc *= n
            dims.append(list(x[1]))
            types.append(INPUT_TYPE.get(x[2], x[2]))
            strides.append(st[::-1] if x[3] is None else list(x[3]))
            concrete.append("")
        elif x[0] == "L":  # TensorList of one tensor
            dims.append([list(x[1])])
            types.append("TensorList")
            strides.append([[1]])
            concrete.append("")
        elif x[0] == "S":
            dims.append([])
            types.append("Scalar")
            strides.append([])
            concrete.append(x[1])
        else:
            dims.append([])
            types.append("")
            strides.append([])
            concrete.append("")
    return dims, types, strides, concrete


def rank_params(b) -> int:
    """Parameters held by one rank (its stage's layers / tp, plus embedding / LM head)."""
    sc, h = b.sc, b.sc.hidden
    n = b.topo.stage_layers(b.stage) * 12 * h * h // sc.tp
    n += (b.stage == 0) * sc.vocab * h // sc.tp
    n += (b.stage == sc.pp - 1) * sc.vocab * h // sc.tp
    return n


def layer_ids(b) -> range:
    first = sum(b.topo.stage_layers(p) for p in range(b.stage))
    return range(first, first + b.topo.stage_layers(b.stage))


# --- forward ------------------------------------------------------------------------------------

def fp8_linear(key) -> bool:
    return key != "lm_head"  # fp8 recipes keep the output layer in bf16


def fp8_cast(b, dims, slot):
    """TransformerEngine's TorchScript cast, bf16 -> e4m3: tex_ts::cast_to_fp8_ts(input, scale,
    amax_history, scale_inv, fp8_tensor, otype), one kernel reading 2 and writing 1 byte each."""
    g = b.kern("fp8_cast", "cast", mem_ns(b.dev, prod(dims) * 3), layer=True)
    meta = T([3], "Float")
    return N("tex_ts::cast_to_fp8_ts", [b.launch(g)],
             info=b.info(T(dims, b.act_dtype), meta, T([1024, 3], "Float"), meta, S(slot),
                         S(TE_FLOAT8_E4M3)))


def scaled_mm(b, role, m, k, n, fast_accum, seq=None):
    """aten::_scaled_mm(mat1 [m, k] row-major, mat2 [k, n] column-major (cuBLASLt fp8 takes TN
    only), scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum), tensorwise scales,
    bf16 out; the kernel runs at the fp8 peak."""
    flops = 2 * m * k * n
    g = b.kern(role, "gemm", gemm_ns(b.dev, flops, peak="fp8_flops"), layer=True, flops=flops)
    scale = T([], "Float")
    return N("aten::_scaled_mm", [b.launch(g)],
             info=b.info(T([m, k], FP8), T([k, n], FP8, [1, k]), scale, scale, NONE, NONE,
                         S(SCALAR_TYPE_BF16), S(fast_accum), seq=seq))


def linear(b, mb, key, in_dims, k, n, role):
    m, dt = prod(in_dims[:-1]), b.act_dtype
    if b.fp8 and fp8_linear(key):  # an Fp8Linear autograd Function: no aten::linear
        casts = [fp8_cast(b, in_dims, 0), fp8_cast(b, [n, k], 1)]
        mm = scaled_mm(b, role, m, k, n, "True", seq=b.fwd_op_seq(mb, key))
        b.emit(MAIN, [*casts, mm])
        return
    flops = 2 * m * k * n
    g = b.kern(role, "gemm", gemm_ns(b.dev, flops), layer=True, flops=flops)
    seq = b.fwd_op_seq(mb, key)
    mm = N("aten::mm", [b.launch(g)], info=b.info(T([m, k], dt), T([k, n], dt)))
    b.emit(MAIN, [N("aten::linear", [mm], info=b.info(T(in_dims, dt), T([n, k], dt), NONE,
                                                      seq=seq))])


def layer_norm(b, mb, key, dims):
    dt, h = b.act_dtype, dims[-1]
    g = b.kern("ln_fwd", "ln", mem_ns(b.dev, prod(dims) * 4), layer=True)
    seq = b.fwd_op_seq(mb, key)
    args = (T(dims, dt), S([h]), T([h], dt), T([h], dt), S(1e-05))
    inner = N("aten::native_layer_norm", [b.launch(g)], info=b.info(*args))
    b.emit(MAIN, [N("aten::layer_norm", [inner], info=b.info(*args, S("True"), seq=seq))])


def pointwise(b, mb, key, op, kernel, dims, inputs):
    g = b.kern(kernel, "elementwise", mem_ns(b.dev, prod(dims) * 2 * inputs), layer=True)
    seq = b.fwd_op_seq(mb, key)
    args = [T(dims, b.act_dtype) for _ in range(inputs - 1)]
    b.emit(MAIN, [N(op, [b.launch(g)], info=b.info(*args, S(1) if op == "aten::add" else
                                                    S("none"), seq=seq))])


def attention(b, mb, li):
    sc, dt = b.sc, b.act_dtype
    s, bs, nh = sc.seq_len, sc.micro_batch_size, sc.heads // sc.tp
    hd = sc.hidden // sc.heads
    flops = 4 * bs * nh * s * s * hd // 2  # causal
    if b.modern:
        g = b.kern("flash_fwd", "flash", gemm_ns(b.dev, flops, ATTN_EFF), layer=True,
                   flops=flops)
        seq = b.fwd_op_seq(mb, (li, "attn"))
        q, qt = T([bs, nh, s, hd], dt), bshd(bs, nh, s, hd, dt)
        # (q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask,
        #  scale, window_size_left, window_size_right)
        inner = N("aten::_flash_attention_forward", [b.launch(g)],
                  info=b.info(qt, qt, qt, NONE, NONE, S(s), S(s), S(0.0), S("True"), S("False"),
                              NONE, NONE, NONE))
        mid = N("aten::_scaled_dot_product_flash_attention", [inner],
                info=b.info(q, q, q, S(0.0), S("True"), S("False"), NONE))
        b.emit(MAIN, [N("aten::scaled_dot_product_attention", [mid],
                        info=b.info(q, q, q, NONE, S(0.0), S("True"), NONE, S("False"),
                                    seq=seq))])
        return
    g = b.kern("bmm", "gemm", gemm_ns(b.dev, flops), layer=True, flops=flops)
    seq = b.fwd_op_seq(mb, (li, "qk"))
    b.emit(MAIN, [N("aten::baddbmm", [b.launch(g)],
                    info=b.info(T([bs * nh, s, s], dt), T([bs * nh, s, hd], dt),
                                T([bs * nh, hd, s], dt), S(0.0), S(0.125), seq=seq))])
    g = b.kern("softmax", "softmax", mem_ns(b.dev, bs * nh * s * s * 4), layer=True)
    seq = b.fwd_op_seq(mb, (li, "softmax"))
    b.emit(MAIN, [N("aten::softmax", [N("aten::_softmax", [b.launch(g)])],
                    info=b.info(T([bs, nh, s, s], dt), S(-1), NONE, seq=seq))])
    g = b.kern("bmm", "gemm", gemm_ns(b.dev, flops), layer=True, flops=flops)
    seq = b.fwd_op_seq(mb, (li, "av"))
    b.emit(MAIN, [N("aten::bmm", [b.launch(g)],
                    info=b.info(T([bs * nh, s, s], dt), T([bs * nh, s, hd], dt), seq=seq))])


def forward_layer(b, mb, li):
    sc = b.sc
    s, bs, h, tp = sc.seq_len, sc.micro_batch_size, sc.hidden, sc.tp
    x = [s, bs, h]
    layer_norm(b, mb, (li, "ln1"), x)
    linear(b, mb, (li, "qkv"), x, h, 3 * h // tp, "fwd")
    attention(b, mb, li)
    linear(b, mb, (li, "proj"), [s, bs, h // tp], h // tp, h, "fwd2")
    b.tp_allreduce(MAIN, s * bs * h)
    pointwise(b, mb, (li, "add1"), "aten::add", "add", x, 3)
    layer_norm(b, mb, (li, "ln2"), x)
    linear(b, mb, (li, "fc1"), x, h, 4 * h // tp, "fwd")
    pointwise(b, mb, (li, "gelu"), "aten::gelu", "gelu", [s, bs, 4 * h // tp], 2)
    linear(b, mb, (li, "fc2"), [s, bs, 4 * h // tp], 4 * h // tp, h, "fwd2")
    b.tp_allreduce(MAIN, s * bs * h)
    pointwise(b, mb, (li, "add2"), "aten::add", "add", x, 3)


def forward(b, mb):
    """One microbatch forward on this stage (embedding on the first, loss on the last)."""
    sc = b.sc
    s, bs, h, tp, v = sc.seq_len, sc.micro_batch_size, sc.hidden, sc.tp, sc.vocab
    first, last = b.stage == 0, b.stage == sc.pp - 1
    if tp > 1 and (first or last):  # Megatron broadcasts the batch from TP rank 0
        node, _ = b.comm("broadcast", b.tp_group, s * bs, s * bs, "Long", TP_STREAM,
                         blocking=True)
        b.emit(MAIN, [node])
    if first:
        g = b.kern("embed", "elementwise", mem_ns(b.dev, s * bs * h * 4))
        seq = b.fwd_op_seq(mb, "embed")
        w = T([v // tp, h], b.act_dtype)
        sel = N("aten::index_select", [b.launch(g)], info=b.info(w, S(0), T([s * bs], "Long")))
        b.emit(MAIN, [N("aten::embedding", [sel], info=b.info(w, T([s, bs], "Long"), S(-1),
                                                              S("False"), S("False"), seq=seq))])
        b.tp_allreduce(MAIN, s * bs * h)
    for li in layer_ids(b):
        forward_layer(b, mb, li)
    if last:
        layer_norm(b, mb, "final_ln", [s, bs, h])
        linear(b, mb, "lm_head", [s, bs, h], h, v // tp, "fwd")
        b.tp_allreduce(MAIN, s * bs, "Float")  # vocab-parallel cross entropy: max, then sum
        b.tp_allreduce(MAIN, s * bs, "Float")
        g1 = b.kern("logsoftmax", "softmax", mem_ns(b.dev, s * bs * v // tp * 8))
        g2 = b.kern("nll", "reduce", mem_ns(b.dev, s * bs * 8))
        seq = b.fwd_op_seq(mb, "loss")
        b.emit(MAIN, [N("aten::cross_entropy_loss", [
            N("aten::log_softmax", [N("aten::_log_softmax", [b.launch(g1)])]),
            N("aten::nll_loss_nd", [N("aten::nll_loss_forward", [b.launch(g2)])])],
            info=b.info(T([s * bs, v // tp], "Float"), T([s * bs], "Long"), NONE, S(1), S(-100),
                        S(0.0), seq=seq))])


# --- backward -----------------------------------------------------------------------------------

def grad_fn(b, mb, key, name, children):
    """evaluate_function: <name> ⊃ <name> ⊃ children, linked to its forward op by `seq`."""
    seq = b.fwd_seq.get((mb, key))
    inner = N(name, children, info={"seq": seq, "bwd": True, "flow_end": True})
    b.emit(BWD, [N(f"autograd::engine::evaluate_function: {name}", [inner],
                   info={"seq": seq, "bwd": True})])


def mm_backward(b, mb, key, m, k, n, name="MmBackward0", kernels=("dgrad", "wgrad"),
                batch=None):
    """Gradients of a forward [(batch,) m, k] x [(batch,) k, n]: dgrad [m, n] x [n, k] and
    wgrad [k, m] x [m, n] (aten::bmm with the batch dim when `batch` is given)."""
    if b.fp8 and name == "MmBackward0" and fp8_linear(key):
        grad_fn(b, mb, key, "Fp8LinearBackward", [fp8_cast(b, [m, n], 0),
                                                  scaled_mm(b, "dgrad", m, n, k, "False"),
                                                  scaled_mm(b, "wgrad", k, m, n, "False")])
        return
    dt, flops = b.act_dtype, 2 * m * k * n * (batch or 1)
    gd = b.kern(kernels[0], "gemm", gemm_ns(b.dev, flops), layer=True, flops=flops)
    gw = b.kern(kernels[1], "gemm", gemm_ns(b.dev, flops), layer=True, flops=flops)
    op = "aten::mm" if name == "MmBackward0" else "aten::bmm"
    lead = [] if batch is None else [batch]
    grad_fn(b, mb, key, name, [
        N(op, [b.launch(gd)], info=b.info(T(lead + [m, n], dt), T(lead + [n, k], dt))),
        N(op, [b.launch(gw)], info=b.info(T(lead + [k, m], dt), T(lead + [m, n], dt)))])


def ln_backward(b, mb, key, dims):
    g1 = b.kern("ln_bwd", "ln", mem_ns(b.dev, prod(dims) * 6), layer=True)
    g2 = b.kern("ln_bwd_gb", "reduce", mem_ns(b.dev, prod(dims) * 4), layer=True)
    grad_fn(b, mb, key, "NativeLayerNormBackward0",
            [N("aten::native_layer_norm_backward", [b.launch(g1), b.launch(g2)])])


def attention_backward(b, mb, li):
    sc = b.sc
    s, bs, nh = sc.seq_len, sc.micro_batch_size, sc.heads // sc.tp
    hd = sc.hidden // sc.heads
    flops = 4 * bs * nh * s * s * hd // 2  # causal forward
    if b.modern:
        dt, io = b.act_dtype, bs * nh * s * hd * 2
        bwd_flops = flops * 5 // 2  # recomputed QK^T plus four matmuls: 2.5x the forward
        g1 = b.kern("flash_bwd_dot", "elementwise", mem_ns(b.dev, io * 3), layer=True)
        g2 = b.kern("flash_bwd", "flash", gemm_ns(b.dev, bwd_flops, ATTN_EFF), layer=True,
                    flops=bwd_flops)
        g3 = b.kern("flash_bwd_cvt", "elementwise", mem_ns(b.dev, io * 3), layer=True)
        # (grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k,
        #  dropout_p, is_causal, philox_seed, philox_offset, scale[, window_size_left/right]);
        # cum_seq_* are undefined tensors for a padded batch, philox_* 0-dim when no dropout.
        q, qt = T([bs, nh, s, hd], dt), bshd(bs, nh, s, hd, dt)
        lse, philox = T([bs, nh, s], "Float"), T([], "Long")
        rest = (NONE, NONE, S(s), S(s), S(0.0), S("True"), philox, philox, NONE)
        grad_fn(b, mb, (li, "attn"), "ScaledDotProductFlashAttentionBackward0", [
            N("aten::_scaled_dot_product_flash_attention_backward", [
                N("aten::_flash_attention_backward",
                  [b.launch(g1), b.launch(g2), b.launch(g3)],
                  info=b.info(qt, qt, qt, qt, qt, lse, *rest, NONE, NONE))],
              info=b.info(q, q, q, q, q, lse, *rest))])
        return
    mm_backward(b, mb, (li, "av"), s, s, hd, "BmmBackward0", ("bmm", "bmm"), batch=bs * nh)
    g = b.kern("softmax_bwd", "softmax", mem_ns(b.dev, bs * nh * s * s * 6), layer=True)
    grad_fn(b, mb, (li, "softmax"), "SoftmaxBackward0",
            [N("aten::_softmax_backward_data", [b.launch(g)])])
    mm_backward(b, mb, (li, "qk"), s, hd, s, "BaddbmmBackward0", ("bmm", "bmm"), batch=bs * nh)


def backward_layer(b, mb, li):
    sc = b.sc
    s, bs, h, tp = sc.seq_len, sc.micro_batch_size, sc.hidden, sc.tp
    m, x = s * bs, [s, bs, h]
    mm_backward(b, mb, (li, "fc2"), m, 4 * h // tp, h)
    g = b.kern("gelu_bwd", "elementwise", mem_ns(b.dev, m * 4 * h // tp * 6), layer=True)
    grad_fn(b, mb, (li, "gelu"), "GeluBackward0", [N("aten::gelu_backward", [b.launch(g)])])
    mm_backward(b, mb, (li, "fc1"), m, h, 4 * h // tp)
    b.tp_allreduce(BWD, m * h)
    ln_backward(b, mb, (li, "ln2"), x)
    mm_backward(b, mb, (li, "proj"), m, h // tp, h)
    attention_backward(b, mb, li)
    mm_backward(b, mb, (li, "qkv"), m, h, 3 * h // tp)
    b.tp_allreduce(BWD, m * h)
    ln_backward(b, mb, (li, "ln1"), x)


def backward(b, mb, grad_sync):
    """One microbatch backward; with grad_sync the DP buckets go out as layers finish."""
    sc = b.sc
    s, bs, h, tp, v = sc.seq_len, sc.micro_batch_size, sc.hidden, sc.tp, sc.vocab
    first, last = b.stage == 0, b.stage == sc.pp - 1
    if last:
        g = b.kern("logsoftmax_bwd", "softmax", mem_ns(b.dev, s * bs * v // tp * 12))
        grad_fn(b, mb, "loss", "LogSoftmaxBackward0",
                [N("aten::_log_softmax_backward_data", [b.launch(g)])])
        mm_backward(b, mb, "lm_head", s * bs, h, v // tp)
        if grad_sync:  # buckets follow the backward: the LM head's grads are ready first
            b.dp_bucket(v * h // tp)
        ln_backward(b, mb, "final_ln", [s, bs, h])
    for li in reversed(layer_ids(b)):
        backward_layer(b, mb, li)
        if grad_sync:
            b.dp_bucket(12 * h * h // tp)
    if first:
        g = b.kern("embed_bwd", "elementwise", mem_ns(b.dev, s * bs * h * 6))
        grad_fn(b, mb, "embed", "EmbeddingBackward0", [N("aten::embedding_backward", [
            N("aten::embedding_dense_backward", [b.launch(g)])])])
        if grad_sync:
            b.dp_bucket(v * h // tp)


# --- optimizer ----------------------------------------------------------------------------------

def optimizer(b):
    """Grad-norm CUDA graph (modern) and the fused Adam step."""
    params = rank_params(b)
    if b.sc.dp_mode == "zero1":
        params = -(-params // b.sc.dp)
    if b.modern:
        gid = 1
        gs = (b.kern("l2norm", "reduce", mem_ns(b.dev, params * 4), graph=(gid, (gid << 32) + 1)),
              b.kern("l2norm_cleanup", "reduce", 3000, graph=(gid, (gid << 32) + 2)),
              b.kern("scale", "elementwise", mem_ns(b.dev, params * 8),
                     graph=(gid, (gid << 32) + 3)))
        b.emit(MAIN, [N("## cuda_graph_replay: clip_grad_norm ##", [
            R("cudaGraphLaunch", 311, gs, dur=b.rnd(20_000, 45_000))], cat="user_annotation")])
    opt = b.begin("Optimizer.step#FusedAdam.step")
    chunks = max(2, b.topo.stage_layers(b.stage))
    key = "adam" if b.modern else "adam_2022"
    launches = [b.launch(b.kern(key, "optimizer", mem_ns(b.dev, params * 30 // chunks)))
                for _ in range(chunks)]
    if b.modern:
        p = L([params])
        b.emit(MAIN, [N("aten::_fused_adamw_", launches,
                        info=b.info(p, p, p, p, p, L([]), S(0.0001), S(0.9), S(0.999), S(0.1),
                                    S(1e-08), S("False"), S("False")))])
    else:
        b.emit(MAIN, launches)
    b.end(opt)
