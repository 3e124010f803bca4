"""A small GPT trainer with hand-written Megatron-style TP/PP/DP and injectable faults.

bprof's reference workload: runs on CPUs with gloo and unchanged on GPUs with nccl, under torchrun,
e.g. `torchrun --nproc_per_node=4 examples/train_gpt.py --tp 2 --dp 2`. See examples/README.md.

Rank layout (Megatron order, tp fastest-varying, then dp, then pp):
    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function
from torch.utils.checkpoint import checkpoint

# ------------------------------------------------------------------------------------------------
# Command line and the effective model shape

EPILOG = """\
named ranges (torch.profiler.record_function, cheap when no profiler runs):
  bprof/forward bprof/backward bprof/optimizer bprof/dataloader bprof/pp_send bprof/pp_recv
  bprof/dp_allreduce bprof/slow_rank bprof/host_sync
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (stages)")
    p.add_argument("--dp", type=int, default=1, help="data-parallel size")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps")
    p.add_argument("--seq", type=int, default=64, help="sequence length (tokens)")
    p.add_argument("--hidden", type=int, default=128, help="model width")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks (before --stage-imbalance)")
    p.add_argument("--heads", type=int, default=4, help="attention heads (split across tp)")
    p.add_argument("--vocab", type=int, default=512, help="vocabulary size (split across tp in the head)")
    p.add_argument("--batch", type=int, default=4, help="micro-batch size (sequences) per DP replica")
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--schedule", choices=["1f1b", "gpipe", "interleaved"], default="1f1b",
                   help="pipeline schedule; interleaved = Megatron's interleaved 1F1B (virtual pipeline) "
                        "over --chunks model chunks per stage")
    p.add_argument("--chunks", type=int, default=1, metavar="V",
                   help="model chunks per pipeline stage (V >= 2, only with --schedule interleaved): the "
                        "layers are split into pp*V chunks, chunk c on stage c %% pp")
    p.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=1234, help="seed for weights and data")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16 = autocast to bfloat16 (fp32 master weights), on CPU and CUDA")
    p.add_argument("--recompute", action="store_true",
                   help="activation checkpointing of every block (non-reentrant)")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DP all-reduce bucket size in MB")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None,
                   help="default: cuda if available (device LOCAL_RANK, nccl), else cpu (gloo)")
    p.add_argument("--log-json", metavar="FILE", default=None,
                   help="append per-rank JSON lines (config, steps, summary) to FILE; "
                        "a '{rank}' in FILE gives one file per rank")
    p.add_argument("--profile-dir", metavar="DIR", default=None,
                   help="run torch.profiler over --profile-steps, write DIR/rank{R}.json.gz")
    p.add_argument("--profile-steps", default="2:4", metavar="A:B",
                   help="half-open range of 0-based steps to profile (default 2:4)")
    faults = p.add_argument_group("faults (each changes only what it says)")
    faults.add_argument(
        "--slow-rank", type=int, default=None, metavar="R",
        help="global rank R runs extra real compute (a loop of 256x256 matmuls) for about "
             "--slow-ms X ms once per step (not per micro-batch), inside the forward of its first "
             "micro-batch, under bprof/slow_rank. Calibrated at start; on CPU each run re-measures "
             "itself and rescales the loop to stay near X ms.")
    faults.add_argument("--slow-ms", type=float, default=0.0, metavar="X",
                        help="duration of the --slow-rank delay in ms")
    faults.add_argument(
        "--dataloader-stall-ms", type=float, default=0.0, metavar="X",
        help="every batch fetch sleeps X ms (time.sleep inside the fetch). Fetches happen once "
             "per micro-batch on the first and on the last pipeline stage only.")
    faults.add_argument(
        "--host-sync", action="store_true",
        help="a .item() host sync on the activations after every transformer layer in forward "
             "(under bprof/host_sync); --recompute does not repeat it.")
    faults.add_argument(
        "--stage-imbalance", type=float, default=None, metavar="F",
        help="the last pipeline stage gets F * layers/pp layers (rounded half up, at least 1), "
             "the other stages layers/pp each; the total layer count changes accordingly "
             "(--layers 4 --pp 2 --stage-imbalance 2 builds 2+4 = 6 layers). Needs --pp >= 2. With "
             "--schedule interleaved each of the last stage's chunks gets F * layers/(pp*chunks).")
    faults.add_argument(
        "--no-bucket", action="store_true",
        help="DP gradients are all-reduced one parameter tensor at a time instead of in buckets.")
    faults.add_argument(
        "--odd-shapes", action="store_true",
        help="hidden becomes hidden+3 if it is a multiple of 64, then is rounded up to a multiple "
             "of --heads that is not a multiple of 64 (default 128 -> 132).")
    faults.add_argument(
        "--transposed-matmul", action="store_true",
        help="after every transformer block in forward, one extra matmul of the seq-major view of "
             "the activations, x.transpose(0, 1) (seq, batch, hidden; not contiguous), by a fixed "
             "(hidden, 8) matrix, under bprof/transposed_matmul and no_grad; the result is unused.")
    faults.add_argument(
        "--matmul-loop", action="store_true",
        help="after every transformer block in forward, a Python loop of 64 matmuls of fixed 32x32 "
             "matrices, under bprof/matmul_loop and no_grad; the results are unused.")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        model_shape(args)
        parse_profile_steps(args.profile_steps)
    except ValueError as err:
        parser.error(str(err))
    if args.slow_rank is not None and args.slow_ms <= 0:
        parser.error("--slow-rank needs --slow-ms X with X > 0")
    return args


def parse_profile_steps(text: str) -> tuple[int, int]:
    try:
        start, stop = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"--profile-steps must look like A:B, got {text!r}") from None
    if not 0 <= start < stop:
        raise ValueError(f"--profile-steps needs 0 <= A < B, got {text!r}")
    return start, stop


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The model actually built: after --odd-shapes and --stage-imbalance."""

    hidden: int
    heads: int
    seq: int
    vocab: int
    layers_per_stage: tuple[int, ...]
    chunks: int = 1  # model chunks per stage (interleaved schedule): a stage's layers split evenly

    def chunk_layers(self, chunk: int) -> range:
        """Global layer ids of model chunk `chunk` (0 .. pp*chunks-1; stage chunk % pp holds it)."""
        pp = len(self.layers_per_stage)
        sizes = [self.layers_per_stage[c % pp] // self.chunks for c in range(pp * self.chunks)]
        return range(sum(sizes[:chunk]), sum(sizes[: chunk + 1]))

    @property
    def layers(self) -> int:
        return sum(self.layers_per_stage)


def model_shape(args: argparse.Namespace) -> ModelShape:
    """Validate the flags against each other and return the shape of the model that is built."""
    for name in ("tp", "pp", "dp", "steps", "seq", "hidden", "layers", "heads", "vocab", "batch",
                 "microbatches"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1")
    if args.heads % args.tp:
        raise ValueError(f"--heads {args.heads} must be divisible by --tp {args.tp}")
    if args.vocab % args.tp:
        raise ValueError(f"--vocab {args.vocab} must be divisible by --tp {args.tp}")
    if args.hidden % args.heads:
        raise ValueError(f"--hidden {args.hidden} must be divisible by --heads {args.heads}")
    if args.layers % args.pp:
        raise ValueError(f"--layers {args.layers} must be divisible by --pp {args.pp}")
    chunks = args.chunks
    if args.schedule == "interleaved":
        if args.pp < 2 or chunks < 2:
            raise ValueError("--schedule interleaved needs --pp >= 2 and --chunks >= 2")
        if args.layers % (args.pp * chunks):
            raise ValueError(f"--layers {args.layers} must be divisible by --pp x --chunks = {args.pp * chunks}")
        if args.microbatches % args.pp:
            raise ValueError(f"--schedule interleaved needs --microbatches divisible by --pp {args.pp} (as Megatron)")
    elif chunks != 1:
        raise ValueError("--chunks needs --schedule interleaved")
    hidden = args.hidden
    if args.odd_shapes:
        if args.heads % 64 == 0:
            raise ValueError("--odd-shapes needs --heads that is not a multiple of 64")
        hidden = hidden + 3 if hidden % 64 == 0 else hidden
        hidden = math.ceil(hidden / args.heads) * args.heads
        while hidden % 64 == 0:
            hidden += args.heads
    per_stage = [args.layers // args.pp] * args.pp
    if args.stage_imbalance is not None:
        if args.pp < 2:
            raise ValueError("--stage-imbalance needs --pp >= 2")
        if args.stage_imbalance <= 0:
            raise ValueError("--stage-imbalance must be > 0")
        per_chunk = per_stage[-1] // chunks
        per_stage[-1] = chunks * max(1, math.floor(args.stage_imbalance * per_chunk + 0.5))
    return ModelShape(hidden, args.heads, args.seq, args.vocab, tuple(per_stage), chunks)


# ------------------------------------------------------------------------------------------------
# FLOPs (PaLM, appendix B): 6·N per token for the matmuls of forward + backward, plus
# 12·layers·hidden·seq per token for attention scores and values (causal masking not discounted).


def param_counts(shape: ModelShape) -> dict[str, int]:
    """Parameters of the whole (unsharded) model, by part; mirrors Block/Stage below."""
    h, v = shape.hidden, shape.vocab
    # ln1, qkv (+bias), out proj (+bias), ln2, fc1 (+bias), fc2 (+bias)
    per_block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (4 * h * h + 4 * h) + (4 * h * h + h)
    return {
        "embedding": v * h + shape.seq * h,  # token + learned position tables: lookups, no matmul
        "blocks": shape.layers * per_block,
        "final_norm": 2 * h,
        "head": h * v,  # LM head, no bias, not tied to the embedding
    }


def flops_per_step(args: argparse.Namespace) -> dict[str, int]:
    shape = model_shape(args)
    counts = param_counts(shape)
    n_non_embedding = counts["blocks"] + counts["final_norm"] + counts["head"]
    tokens = args.batch * args.microbatches * args.dp * shape.seq
    attention = 12 * shape.layers * shape.hidden * shape.seq * tokens
    model = 6 * n_non_embedding * tokens + attention
    executed = model
    if args.recompute:
        # One more forward of every checkpointed block (not of the final norm and head).
        executed += 2 * counts["blocks"] * tokens + attention // 3
    return {
        "model_flops_per_step": model,
        "executed_flops_per_step": executed,
        "tokens_per_step": tokens,
        "params": sum(counts.values()),
        "non_embedding_params": n_non_embedding,
    }


def model_flops_per_step(args: argparse.Namespace) -> int:
    """PaLM model FLOPs of one optimizer step (global batch): 6·N·tokens + 12·L·h·seq·tokens."""
    return flops_per_step(args)["model_flops_per_step"]


def model_summary(args: argparse.Namespace) -> dict:
    shape = model_shape(args)
    flops = flops_per_step(args)
    return {
        **flops,
        "layers": shape.layers,
        "layers_per_stage": list(shape.layers_per_stage),
        "hidden": shape.hidden,
        "heads": shape.heads,
        "seq": shape.seq,
        "vocab": shape.vocab,
        "batch": args.batch,
        "tp": args.tp,
        "pp": args.pp,
        "dp": args.dp,
        "microbatches": args.microbatches,
        "schedule": args.schedule,
        "chunks": args.chunks,
        "dtype": args.dtype,
        "recompute": args.recompute,
    }


# ------------------------------------------------------------------------------------------------
# Process groups


@dataclasses.dataclass
class Parallel:
    rank: int
    world_size: int
    tp: int
    pp: int
    dp: int
    tp_rank: int
    pp_rank: int
    dp_rank: int
    tp_group: dist.ProcessGroup
    pp_group: dist.ProcessGroup
    dp_group: dist.ProcessGroup
    device: torch.device

    @property
    def first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1

    def stage_rank(self, pp_rank: int) -> int:
        """Global rank of the same (tp, dp) position on another pipeline stage."""
        return pp_rank * self.dp * self.tp + self.dp_rank * self.tp + self.tp_rank


def init_parallel(args: argparse.Namespace) -> Parallel:
    if "RANK" not in os.environ:  # plain `python train_gpt.py`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    world_size = int(os.environ["WORLD_SIZE"])
    if args.tp * args.pp * args.dp != world_size:
        sys.exit(f"train_gpt.py: error: --tp {args.tp} x --pp {args.pp} x --dp {args.dp} = "
                 f"{args.tp * args.pp * args.dp}, but WORLD_SIZE is {world_size}")
    if args.slow_rank is not None and not 0 <= args.slow_rank < world_size:
        sys.exit(f"train_gpt.py: error: --slow-rank {args.slow_rank} is not a rank of {world_size}")
    device_kind = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device_kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    t, d, p = args.tp, args.dp, args.pp
    # Every rank creates every group, in the same order; it keeps the ones it belongs to.
    mine = {}
    for pp_rank in range(p):
        for dp_rank in range(d):
            ranks = [pp_rank * d * t + dp_rank * t + i for i in range(t)]
            g = dist.new_group(ranks, group_desc="TENSOR_MODEL_PARALLEL_GROUP")
            if rank in ranks:
                mine["tp"] = g
    for pp_rank in range(p):
        for tp_rank in range(t):
            ranks = [pp_rank * d * t + i * t + tp_rank for i in range(d)]
            g = dist.new_group(ranks, group_desc="DATA_PARALLEL_GROUP")
            if rank in ranks:
                mine["dp"] = g
    for dp_rank in range(d):
        for tp_rank in range(t):
            ranks = [i * d * t + dp_rank * t + tp_rank for i in range(p)]
            g = dist.new_group(ranks, group_desc="PIPELINE_MODEL_PARALLEL_GROUP")
            if rank in ranks:
                mine["pp"] = g
    par = Parallel(rank=rank, world_size=world_size, tp=t, pp=p, dp=d, tp_rank=rank % t,
                   dp_rank=(rank // t) % d, pp_rank=rank // (t * d), tp_group=mine["tp"],
                   pp_group=mine["pp"], dp_group=mine["dp"], device=device)
    # One small collective per group so that connections are set up before step 0, and so that a
    # group's first use is never a partial batch of point-to-point ops (undefined for nccl).
    for g in (par.tp_group, par.dp_group, par.pp_group):
        dist.all_reduce(torch.zeros(1, device=device), group=g)
    return par


# ------------------------------------------------------------------------------------------------
# Tensor parallelism (Megatron-LM's mappings and parallel linears, written out)


class _CopyToTP(torch.autograd.Function):
    """Identity in forward, all-reduce of the gradient over TP in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromTP(torch.autograd.Function):
    """All-reduce over TP in forward, identity in backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along the last dim over TP in forward, keep own slice of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        world, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(world, dim=-1)[rank].contiguous(), None


class ColumnParallelLinear(nn.Module):
    """y = x Aᵀ + b with A split by output rows over TP; the input is copied into the TP region."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group, gather_output=False):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.group, self.gather_output = group, gather_output
        self.tp = dist.get_world_size(group)

    def forward(self, x):
        if self.tp > 1:
            x = _CopyToTP.apply(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        if self.gather_output and self.tp > 1:
            y = _GatherFromTP.apply(y, self.group)
        return y


class RowParallelLinear(nn.Module):
    """y = x Aᵀ + b with A split by input columns over TP; partial sums are all-reduced."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, group):
        super().__init__()
        self.weight, self.bias = nn.Parameter(weight), nn.Parameter(bias)
        self.group, self.tp = group, dist.get_world_size(group)

    def forward(self, x):
        y = F.linear(x, self.weight)
        if self.tp > 1:
            y = _ReduceFromTP.apply(y, self.group)
        return y + self.bias


# ------------------------------------------------------------------------------------------------
# Model. Weights are drawn for the full model from per-layer generators and then sliced, so that
# every (tp, pp) layout starts from the same function (step 0's loss is layout-independent).


def _normal(gen: torch.Generator, *size: int) -> torch.Tensor:
    return torch.randn(*size, generator=gen) * 0.02


def _rows(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return t.chunk(world, dim=0)[rank].clone()


def _cols(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    return t.chunk(world, dim=1)[rank].clone()


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a GELU MLP, heads and MLP split over TP."""

    def __init__(self, shape: ModelShape, par: Parallel, gen: torch.Generator):
        super().__init__()
        h, r, w = shape.hidden, par.tp_rank, par.tp
        self.local_heads, self.head_dim = shape.heads // w, h // shape.heads
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        q, k, v = (_normal(gen, h, h) for _ in range(3))
        qkv_w = torch.cat([_rows(m, r, w) for m in (q, k, v)])  # this rank's heads of q, k and v
        self.qkv = ColumnParallelLinear(qkv_w, torch.zeros(qkv_w.shape[0]), par.tp_group)
        self.proj = RowParallelLinear(_cols(_normal(gen, h, h), r, w), torch.zeros(h), par.tp_group)
        self.fc1 = ColumnParallelLinear(_rows(_normal(gen, 4 * h, h), r, w),
                                        torch.zeros(4 * h // w), par.tp_group)
        self.fc2 = RowParallelLinear(_cols(_normal(gen, h, 4 * h), r, w), torch.zeros(h), par.tp_group)

    def forward(self, x):
        b, s, _ = x.shape
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, self.local_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (b, heads, s, head_dim)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Stage(nn.Module):
    """This rank's share of the model: embeddings on the first stage, final norm + head on the last.
    With --chunks V, one of the rank's V model chunks: model chunk `chunk` * pp + pp_rank, the
    embeddings on model chunk 0, the head on the last."""

    def __init__(self, shape: ModelShape, par: Parallel, args: argparse.Namespace, chunk: int = 0):
        super().__init__()
        model_chunk = chunk * par.pp + par.pp_rank
        self.layer_ids = list(shape.chunk_layers(model_chunk))
        self.is_first = model_chunk == 0
        self.is_last = model_chunk == par.pp * shape.chunks - 1
        self.blocks = nn.ModuleList(
            Block(shape, par, torch.Generator().manual_seed(args.seed * 100_003 + 1 + i))
            for i in self.layer_ids
        )
        gen = torch.Generator().manual_seed(args.seed * 100_003)
        tok, pos, head = (_normal(gen, shape.vocab, shape.hidden),
                          _normal(gen, shape.seq, shape.hidden),
                          _normal(gen, shape.vocab, shape.hidden))
        self.tok_emb = self.pos_emb = self.ln_f = self.head = None
        if self.is_first:  # replicated over TP (not vocab-parallel)
            self.tok_emb, self.pos_emb = nn.Parameter(tok), nn.Parameter(pos)
        if self.is_last:  # vocab split over TP, logits all-gathered
            self.ln_f = nn.LayerNorm(shape.hidden)
            self.head = ColumnParallelLinear(_rows(head, par.tp_rank, par.tp), None, par.tp_group,
                                             gather_output=True)
        self.recompute, self.host_sync = args.recompute, args.host_sync
        # planted work (--transposed-matmul, --matmul-loop): fixed tensors, not parameters
        self.transposed_w = (torch.randn(shape.hidden, 8, generator=gen).to(par.device)
                             if args.transposed_matmul else None)
        self.loop_mats = ([torch.randn(32, 32, generator=gen).to(par.device) for _ in range(2 * 64)]
                          if args.matmul_loop else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: token ids (b, s) on the first stage, else activations (b, s, hidden)."""
        if self.tok_emb is not None:
            x = self.tok_emb[x] + self.pos_emb[: x.shape[1]]
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.recompute else block(x)
            if self.host_sync:
                with record_function("bprof/host_sync"):
                    x[0, 0, 0].item()
            if self.transposed_w is not None:
                with torch.no_grad(), record_function("bprof/transposed_matmul"):
                    torch.matmul(x.transpose(0, 1), self.transposed_w)
            if self.loop_mats is not None:
                with torch.no_grad(), record_function("bprof/matmul_loop"):
                    for a, b in zip(self.loop_mats[0::2], self.loop_mats[1::2]):
                        torch.mm(a, b)
        if self.head is not None:
            x = self.head(self.ln_f(x))
        return x


# ------------------------------------------------------------------------------------------------
# Synthetic data: next token = perm[token], replaced by a uniform random token with probability
# NOISE. Learnable (the loss floor is about NOISE·ln(vocab) + entropy of the mix), deterministic per
# (seed, dp_rank, step, micro-batch), identical on every TP rank and stage of a DP replica.

NOISE = 0.1


class SyntheticData:
    def __init__(self, args: argparse.Namespace, dp_rank: int, device: torch.device):
        self.args, self.dp_rank, self.device = args, dp_rank, device
        self.perm = torch.randperm(args.vocab, generator=torch.Generator().manual_seed(args.seed)).tolist()

    def fetch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.args
        if a.dataloader_stall_ms > 0:
            time.sleep(a.dataloader_stall_ms / 1e3)
        index = (step * a.microbatches + micro) * a.dp + self.dp_rank
        gen = torch.Generator().manual_seed(a.seed * 7_919 + 1 + index)
        first = torch.randint(a.vocab, (a.batch,), generator=gen).tolist()
        noise = (torch.rand(a.batch, a.seq, generator=gen) < NOISE).tolist()
        random_tokens = torch.randint(a.vocab, (a.batch, a.seq), generator=gen).tolist()
        rows = []
        for b in range(a.batch):  # plain Python: a chain of tiny torch ops would cost milliseconds
            row = [first[b]]
            for i in range(a.seq):
                row.append(random_tokens[b][i] if noise[b][i] else self.perm[row[-1]])
            rows.append(row)
        tokens = torch.tensor(rows, dtype=torch.long, device=self.device)
        return tokens[:, :-1], tokens[:, 1:]


# ------------------------------------------------------------------------------------------------
# Per-step timing and counters. On CUDA, device work is timed with events, read at step end.


class StepStats:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.reset()

    def reset(self):
        self.host_ms: dict[str, float] = {}
        self.events: list[tuple[str, object, object]] = []
        self.counts: dict[str, int] = {"dp_allreduce_calls": 0, "pp_p2p_calls": 0}

    @contextlib.contextmanager
    def span(self, name: str, host: bool = False):
        """Time a phase under record_function('bprof/<name>') and add it to <name>_ms."""
        with record_function(f"bprof/{name}"):
            if self.cuda and not host:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                yield
                end.record()
                self.events.append((name, start, end))
            else:
                t0 = time.perf_counter()
                yield
                self.host_ms[name] = self.host_ms.get(name, 0.0) + (time.perf_counter() - t0) * 1e3

    def finish(self) -> dict:
        ms = dict(self.host_ms)
        if self.events:
            torch.cuda.synchronize()
            for name, start, end in self.events:
                ms[name] = ms.get(name, 0.0) + start.elapsed_time(end)
        out = {f"{k}_ms": round(ms.get(k, 0.0), 3) for k in
               ("forward", "backward", "dataloader", "pp_send", "pp_recv", "dp_allreduce",
                "optimizer", "slow_rank")}
        return {**out, **self.counts}


# ------------------------------------------------------------------------------------------------
# Pipeline point-to-point (Megatron's p2p_communication, reduced to what the schedules use)


class Pipe:
    """Sends and receives activations/gradients of shape (batch, seq, hidden) between stages."""

    def __init__(self, par: Parallel, shape: ModelShape, args: argparse.Namespace, stats: StepStats):
        self.par, self.stats = par, stats
        self.buffer_shape = (args.batch, shape.seq, shape.hidden)
        # Activations travel in fp32: under bf16 autocast the residual stream stays fp32.
        self.dtype = torch.float32
        self.prev = None if par.first_stage else par.stage_rank(par.pp_rank - 1)
        self.next = None if par.last_stage else par.stage_rank(par.pp_rank + 1)

    def _exchange(self, send: torch.Tensor | None, send_to: int | None, recv_from: int | None):
        ops, received = [], None
        if send is not None and send_to is not None:
            ops.append(dist.P2POp(dist.isend, send.detach().to(self.dtype).contiguous(), send_to,
                                  self.par.pp_group))
        if recv_from is not None:
            received = torch.empty(self.buffer_shape, dtype=self.dtype, device=self.par.device)
            ops.append(dist.P2POp(dist.irecv, received, recv_from, self.par.pp_group))
        if not ops:
            return None
        # An exchange that receives is named pp_recv: it lasts until the peer's tensor arrives.
        with self.stats.span("pp_recv" if received is not None else "pp_send"):
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        self.stats.counts["pp_p2p_calls"] += len(ops)
        return received

    def recv_forward(self):
        return self._exchange(None, None, self.prev)

    def send_forward(self, output):
        self._exchange(output, self.next, None)

    def recv_backward(self):
        return self._exchange(None, None, self.next)

    def send_backward(self, grad):
        self._exchange(grad, self.prev, None)

    def send_forward_recv_backward(self, output):
        return self._exchange(output, self.next, self.next)

    def send_backward_recv_forward(self, grad):
        return self._exchange(grad, self.prev, self.prev)

    # The interleaved schedule's exchanges (Megatron's send_forward_recv_forward,
    # send_backward_recv_backward and send_forward_backward_recv_forward_backward in one): a ring,
    # the last stage sends to the first for the next model chunk. Activations go first and
    # gradients second, each with its own tag: with pp = 2 both directions join the same two
    # ranks, and the order and tags keep an activation from landing in a gradient's buffer.

    def exchange(self, output=None, grad=None, recv_prev=False, recv_next=False):
        """Send `output` to the next stage and `grad` to the previous one (each if not None),
        receive from the previous / next stage as asked; returns (from prev, from next)."""
        par = self.par
        next_rank, prev_rank = (par.stage_rank((par.pp_rank + k) % par.pp) for k in (1, -1))
        ops, from_prev, from_next = [], None, None
        if output is not None:
            ops.append(dist.P2POp(dist.isend, output.detach().to(self.dtype).contiguous(), next_rank, par.pp_group, tag=1))
        if recv_prev:
            from_prev = torch.empty(self.buffer_shape, dtype=self.dtype, device=par.device)
            ops.append(dist.P2POp(dist.irecv, from_prev, prev_rank, par.pp_group, tag=1))
        if grad is not None:
            ops.append(dist.P2POp(dist.isend, grad.detach().to(self.dtype).contiguous(), prev_rank, par.pp_group, tag=2))
        if recv_next:
            from_next = torch.empty(self.buffer_shape, dtype=self.dtype, device=par.device)
            ops.append(dist.P2POp(dist.irecv, from_next, next_rank, par.pp_group, tag=2))
        if ops:
            with self.stats.span("pp_recv" if recv_prev or recv_next else "pp_send"):
                for work in dist.batch_isend_irecv(ops):
                    work.wait()
            self.stats.counts["pp_p2p_calls"] += len(ops)
        return from_prev, from_next


# ------------------------------------------------------------------------------------------------
# Training step


class SlowRank:
    """Extra real compute: a loop of 256x256 matmuls that takes about `ms` per call.

    Calibrated once at start. On CPU the other ranks compete for the same cores, so every call also
    re-measures its own wall time and rescales the loop (damped) to keep the delay near `ms`.
    """

    def __init__(self, ms: float, device: torch.device):
        self.ms, self.device = ms, device
        self.a = torch.randn(256, 256, device=device)
        self.run(2)  # warm-up
        probe = 4
        while (elapsed := self._time(probe)) < 20.0:  # lengthen until the probe is measurable
            probe *= 2
        self.iters = max(1, round(ms * probe / elapsed))
        self.calibrated_ms = self._time(self.iters)

    def _time(self, iters: int) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        self.run(iters)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return (time.perf_counter() - t0) * 1e3

    def run(self, iters: int) -> torch.Tensor:
        x = self.a
        for _ in range(iters):
            x = torch.tanh(x @ self.a)  # tanh keeps values bounded
        return x

    def __call__(self) -> None:
        if self.device.type == "cuda":  # no host sync inside the step; device time is stable
            self.run(self.iters)
            return
        measured = self._time(self.iters)
        self.iters = max(1, round(self.iters * (self.ms / max(measured, 1e-3)) ** 0.5))


class Trainer:
    def __init__(self, args: argparse.Namespace, par: Parallel, shape: ModelShape):
        self.args, self.par, self.shape = args, par, shape
        self.stats = StepStats(par.device)
        # one model chunk per stage, or --chunks of them (interleaved schedule)
        self.chunks = [Stage(shape, par, args, c).to(par.device) for c in range(shape.chunks)]
        self.layer_ids = [i for chunk in self.chunks for i in chunk.layer_ids]
        self.params = [p for chunk in self.chunks for p in chunk.parameters()]
        self.optimizer = torch.optim.AdamW(self.params, lr=args.lr, betas=(0.9, 0.95),
                                           weight_decay=0.01)
        self.data = SyntheticData(args, par.dp_rank, par.device)
        self.pipe = Pipe(par, shape, args, self.stats)
        self.slow = SlowRank(args.slow_ms, par.device) if args.slow_rank == par.rank else None
        self.autocast = (torch.autocast(par.device.type, dtype=torch.bfloat16)
                         if args.dtype == "bf16" else contextlib.nullcontext())
        self.losses: list[torch.Tensor] = []  # this step's micro-batch losses (last stage)

    def forward_step(self, step: int, micro: int, input_tensor, chunk: int = 0):
        """One micro-batch through this stage (its model chunk `chunk`); returns the output (or the
        scaled loss on the last)."""
        model = self.chunks[chunk]
        tokens = labels = None
        if model.is_first or model.is_last:
            with self.stats.span("dataloader", host=True):
                tokens, labels = self.data.fetch(step, micro)
        with self.stats.span("forward"):
            if self.slow is not None and micro == 0 and chunk == 0:
                with self.stats.span("slow_rank"):
                    self.slow()
            with self.autocast:
                out = model(tokens if model.is_first else input_tensor)
            if model.is_last:
                loss = F.cross_entropy(out.float().view(-1, self.shape.vocab), labels.reshape(-1))
                self.losses.append(loss.detach())
                return loss / self.args.microbatches
        return out

    def backward_step(self, input_tensor, output, output_grad):
        with self.stats.span("backward"):
            torch.autograd.backward(output, grad_tensors=output_grad)
        return None if input_tensor is None else input_tensor.grad

    def _input(self, received):
        return None if received is None else received.requires_grad_(True)

    def schedule_1f1b(self, step: int):
        m, pipe = self.args.microbatches, self.pipe
        warmup = min(self.par.pp - self.par.pp_rank - 1, m)
        inputs, outputs, micro = [], [], 0
        for _ in range(warmup):
            x = self._input(pipe.recv_forward())
            y = self.forward_step(step, micro, x)
            micro += 1
            pipe.send_forward(y)
            inputs.append(x)
            outputs.append(y)
        x = self._input(pipe.recv_forward()) if m > warmup else None
        for i in range(m - warmup):
            y = self.forward_step(step, micro, x)
            micro += 1
            grad_out = pipe.send_forward_recv_backward(y)
            inputs.append(x)
            outputs.append(y)
            grad_in = self.backward_step(inputs.pop(0), outputs.pop(0), grad_out)
            if i == m - warmup - 1:
                pipe.send_backward(grad_in)
            else:
                x = self._input(pipe.send_backward_recv_forward(grad_in))
        for _ in range(warmup):
            grad_out = pipe.recv_backward()
            pipe.send_backward(self.backward_step(inputs.pop(0), outputs.pop(0), grad_out))

    def schedule_gpipe(self, step: int):
        inputs, outputs = [], []
        for micro in range(self.args.microbatches):
            x = self._input(self.pipe.recv_forward())
            y = self.forward_step(step, micro, x)
            self.pipe.send_forward(y)
            inputs.append(x)
            outputs.append(y)
        for x, y in zip(inputs, outputs):
            grad_out = self.pipe.recv_backward()
            self.pipe.send_backward(self.backward_step(x, y, grad_out))

    def schedule_interleaved(self, step: int):
        """Megatron's interleaved 1F1B (forward_backward_pipelining_with_interleaving, without p2p
        overlap): virtual micro-batch k runs on model chunk (k mod p*V) // p (reversed for
        backwards), so each stage takes p micro-batches through one chunk before the next."""
        p, r, v, m = self.par.pp, self.par.pp_rank, len(self.chunks), self.args.microbatches
        total, pipe = v * m, self.pipe
        first_rank, last_rank = r == 0, r == p - 1

        def chunk_of(k, forward):
            c = (k % (p * v)) // p
            return c if forward else v - 1 - c

        all_warmup = m == p
        warmup = total if all_warmup else min((p - r - 1) * 2 + (v - 1) * p, total)
        remaining = total - warmup
        inputs, outputs, grads = ([[] for _ in range(v)] for _ in range(3))
        micro = [0] * v  # per chunk: forwards done = the next forward's micro-batch

        def forward(k):
            c = chunk_of(k, True)
            if self.chunks[c].is_first and len(inputs[c]) == len(outputs[c]):
                inputs[c].append(None)
            y = self.forward_step(step, micro[c], inputs[c][-1], c)
            micro[c] += 1
            outputs[c].append(y)
            return None if self.chunks[c].is_last else y  # the loss goes nowhere

        def backward(k):
            c = chunk_of(k, False)
            if self.chunks[c].is_last and not grads[c]:
                grads[c].append(None)
            grad_in = self.backward_step(inputs[c].pop(0), outputs[c].pop(0), grads[c].pop(0))
            return None if self.chunks[c].is_first else grad_in

        inputs[0].append(None if first_rank else self._input(pipe.exchange(recv_prev=True)[0]))
        for k in range(warmup):
            out = forward(k)
            next_chunk = chunk_of(k + 1, True)
            recv_prev = not (first_rank and next_chunk == 0) and k != total - 1
            if k == warmup - 1 and not all_warmup:
                x, grad_out = pipe.exchange(out, None, recv_prev, recv_next=not last_rank)
                if not last_rank:
                    grads[v - 1].append(grad_out)
            else:
                x, _ = pipe.exchange(out, None, recv_prev)
            if recv_prev:
                inputs[next_chunk].append(self._input(x))
        for k in range(remaining):
            fk = k + warmup
            out = forward(fk)
            grad_in = backward(k)
            recv_prev, recv_next = True, True
            if first_rank:  # the first stage is p - 1 virtual micro-batches ahead of the last
                next_f = chunk_of(fk - (p - 1), True)
                recv_prev = next_f != v - 1
                next_f += 1
            else:
                next_f = chunk_of(fk + 1, True)
            if last_rank:  # and the last ahead of the first in backward
                next_b = chunk_of(k - (p - 1), False)
                recv_next = next_b != 0
                next_b -= 1
            else:
                next_b = chunk_of(k + 1, False)
            if k == remaining - 1:
                recv_prev = False
            x, grad_out = pipe.exchange(out, grad_in, recv_prev, recv_next)
            if recv_prev:
                inputs[next_f].append(self._input(x))
            if recv_next:
                grads[next_b].append(grad_out)
        if all_warmup:
            grads[v - 1].append(None if last_rank else pipe.exchange(recv_next=True)[1])
        for k in range(remaining, total):
            grad_in = backward(k)
            next_b = chunk_of(k + 1, False)
            recv_next = not (last_rank and next_b == v - 1) and k != total - 1
            _, grad_out = pipe.exchange(None, grad_in, recv_next=recv_next)
            if recv_next:
                grads[next_b].append(grad_out)

    def allreduce_grads(self):
        """Average gradients over DP: flat buckets of up to --bucket-mb, in reverse parameter order."""
        d = self.par.dp
        if d == 1:
            return
        grads = [p.grad for p in reversed(self.params) if p.grad is not None]
        if self.args.no_bucket:
            buckets = [[g] for g in grads]
        else:
            limit, buckets, size = self.args.bucket_mb * 2**20, [], math.inf
            for g in grads:
                nbytes = g.numel() * g.element_size()
                if size + nbytes > limit or buckets[-1][-1].dtype != g.dtype:
                    buckets.append([])
                    size = 0
                buckets[-1].append(g)
                size += nbytes
        with self.stats.span("dp_allreduce"):
            for bucket in buckets:
                flat = torch.cat([g.reshape(-1) for g in bucket]) if len(bucket) > 1 else bucket[0]
                dist.all_reduce(flat, group=self.par.dp_group)
                flat.div_(d)
                if len(bucket) > 1:
                    offset = 0
                    for g in bucket:
                        g.copy_(flat[offset: offset + g.numel()].view_as(g))
                        offset += g.numel()
                self.stats.counts["dp_allreduce_calls"] += 1

    def train_step(self, step: int) -> tuple[float | None, dict]:
        self.stats.reset()
        self.losses = []
        t0 = time.perf_counter()
        if self.args.schedule == "gpipe":
            self.schedule_gpipe(step)
        elif self.args.schedule == "interleaved":
            self.schedule_interleaved(step)
        else:
            self.schedule_1f1b(step)
        self.allreduce_grads()
        with self.stats.span("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        loss = float(torch.stack(self.losses).mean()) if self.losses else None
        stats = self.stats.finish()
        stats["step_ms"] = round((time.perf_counter() - t0) * 1e3, 3)
        return loss, stats


# ------------------------------------------------------------------------------------------------
# Main loop, logging, profiler


class JsonLog:
    def __init__(self, path: str | None, rank: int):
        self.file = None
        if path:
            self.file = open(path.replace("{rank}", str(rank)), "a", buffering=1)
        self.rank = rank

    def write(self, kind: str, **fields):
        if self.file is not None:
            # One write() per line: ranks appending to one file do not interleave within a line.
            self.file.write(json.dumps({"kind": kind, "rank": self.rank, **fields}) + "\n")

    def close(self):
        if self.file is not None:
            self.file.close()


def make_profiler(args: argparse.Namespace, par: Parallel, summary: dict):
    if not args.profile_dir:
        return contextlib.nullcontext(None)
    start, stop = parse_profile_steps(args.profile_steps)
    os.makedirs(args.profile_dir, exist_ok=True)
    path = os.path.join(args.profile_dir, f"rank{par.rank}.json.gz")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if par.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    # ProfilerStep#N is numbered by prof.step() calls, so N equals the 0-based training step.
    warmup = 1 if start >= 1 else 0
    schedule = torch.profiler.schedule(wait=start - warmup, warmup=warmup, active=stop - start,
                                       repeat=1)

    prof = torch.profiler.profile(activities=activities, schedule=schedule, record_shapes=True,
                                  on_trace_ready=lambda p: p.export_chrome_trace(path))
    # Kineto takes metadata only while it records (add_metadata_json at export time is dropped);
    # a preset is added when recording starts. The .gz path makes the export gzip-compressed.
    prof.preset_metadata_json("bprof_model", json.dumps(summary))
    return prof


def declare_to_bprof(summary: dict) -> None:
    """Under `bprof record`, declare the FLOPs so MFU/HFU need no flag; without bprof, nothing."""
    try:
        import bprof
    except ImportError:
        return
    bprof.set_model_flops(summary["model_flops_per_step"], summary["executed_flops_per_step"],
                          **{k: v for k, v in summary.items() if k not in ("model_flops_per_step", "executed_flops_per_step")})


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    shape = model_shape(args)
    par = init_parallel(args)
    torch.manual_seed(args.seed)
    summary = model_summary(args)
    if par.rank == 0:
        print("bprof-model: " + json.dumps(summary), flush=True)
    declare_to_bprof(summary)
    trainer = Trainer(args, par, shape)
    log = JsonLog(args.log_json, par.rank)
    log.write("config", tp_rank=par.tp_rank, dp_rank=par.dp_rank, pp_rank=par.pp_rank,
              device=str(par.device), layer_ids=trainer.layer_ids,
              num_param_tensors=len(trainer.params),
              local_params=sum(p.numel() for p in trainer.params),
              process_groups=dist.distributed_c10d._get_all_pg_configs(),
              slow_rank_calibrated_ms=trainer.slow.calibrated_ms if trainer.slow else None,
              model=summary)
    reporter = par.last_stage and par.tp_rank == 0 and par.dp_rank == 0
    losses, step_times = [], []
    with make_profiler(args, par, summary) as prof:
        for step in range(args.steps):
            loss, stats = trainer.train_step(step)
            log.write("step", step=step, loss=loss, **stats)
            step_times.append(stats["step_ms"] / 1e3)
            if reporter:
                losses.append(loss)
                print("bprof-step: " + json.dumps({"step": step, "loss": round(loss, 5),
                      "step_time_s": round(stats["step_ms"] / 1e3, 5), "rank": par.rank}),
                      flush=True)
            if prof is not None:
                prof.step()
    later = step_times[1:] or step_times  # step 0 includes one-off warm-up
    final = {"steps": args.steps, "mean_step_time_s": round(sum(later) / len(later), 5)}
    if reporter:
        final.update(first_loss=losses[0], last_loss=losses[-1], rank=par.rank)
        print("bprof-summary: " + json.dumps(final), flush=True)
    log.write("summary", **final)
    log.close()
    dist.destroy_process_group()


def exit_without_finalizing(code: int = 0) -> None:
    """Leave once training is over without Python's interpreter finalization.

    torch 2.13 with gloo: each collective's work object keeps the launching thread's state, which
    holds a Python contextvars.Context. A gloo worker thread can still hold the last reference to a
    finished work when the interpreter finalizes; dropping it needs the GIL, a thread asking for the
    GIL during finalization is ended by pthread_exit, and that unwinds through a noexcept
    destructor: "terminate called without an active exception", SIGABRT, exit code -6 after the
    run's work is done. Seen in 1 of 12 four-rank runs of tests/profiler/toy_train.py beside two
    busy loops, with and without bprof (core dumps: ProcessGroupGloo::runLoop ->
    ~AsyncAllreduceWork -> ~ThreadLocalState -> SafePyObject decref -> take_gil -> pthread_exit).
    The atexit handlers (bprof's recorder among them) still run; then the process leaves.
    """
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
    exit_without_finalizing(0)
