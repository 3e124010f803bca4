"""Op replay: rerun a recorded op signature (or a loop of them) with warm-up and repeats, and its fix variants.

Timing reuses bprof calibrate's batches (a monotonic clock on CPU, CUDA events on GPU); a variant is
timed interleaved with its baseline, batch by batch, so drift in the machine's load hits both.
torch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable

from bprof.replay.calibrate import _time_batch
from bprof.replay.et_rebuild import build_nodes
from bprof.replay.plan import OpItem, spread_of
from bprof.replay.rebuild import NotRebuildable, Rebuilt, make_tensor, rebuild
from bprof.replay.results import ReplayResult, classify, judge, samples_result

OP_VARIANTS = ("bf16", "pad8", "pad64", "pad128", "contiguous", "bmm")
PAD_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")


def replay_op(torch, item: OpItem, dev, variants: tuple[str, ...], repeats: int, min_time_s: float,
              num_threads: int | None) -> list[ReplayResult]:
    """The baseline replay of `item` and each applicable variant, one ReplayResult each."""
    base = ReplayResult(item.kind, item.label, item.key, item.rank, "baseline", "not_rebuildable", dev.type,
                        shapes=item.dims, dtypes=item.types, strides=item.strides, num_threads=num_threads,
                        calls_per_step=item.calls_per_step, traced_ns=int(_median(item.traced_ns)),
                        traced_spread_frac=spread_of(item.traced_ns), traced_basis=_basis(item),
                        finding_id=item.finding_id, finding_title=item.finding_title)
    fns: dict[str, Callable] = {}
    skipped: list[ReplayResult] = []
    try:
        rebuilt = rebuild(torch, item.name, item.dims, item.types, item.strides, item.concrete, dev)
    except NotRebuildable as exc:
        try:
            fns["baseline"] = from_exec_trace(torch, item, dev)
        except NotRebuildable as et_exc:
            base.reason = str(exc) + (f"; from the execution trace: {et_exc}" if item.et_node else
                                        "; recorded with --execution-trace, it could be rebuilt from the execution trace")
            return [base]
        base.reason = f"rebuilt from the execution trace (its Kineto signature is not enough: {exc})"
        skipped = [_derived(base, name, "not_applicable", "variants rebuild the Kineto signature, which is not enough for this op")
                   for name in variants]
    else:
        fns["baseline"] = _loop(rebuilt, item.loop_len)
        for name in variants:
            try:
                fns[name] = _variant(torch, name, item, rebuilt, dev)
            except NotApplicable as exc:
                skipped.append(_derived(base, name, "not_applicable", str(exc)))
    try:
        samples = compare(torch, dev, fns, repeats, min_time_s)
    except Exception as exc:  # the op failed when run for real (out of memory, a kernel's own check)
        base.status, base.reason = "failed", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"
        return [base]
    return judged(base, item.traced_ns, samples, _NOTES) + skipped


def judged(base: ReplayResult, traced_ns: list[int], samples: dict[str, list[float]],
           notes: dict[str, str]) -> list[ReplayResult]:
    """The baseline filled in from its samples and classified, then one result per variant timed
    beside it, with its speedup and verdict against the baseline's samples."""
    samples_result(base, samples["baseline"])
    base.classification = classify(traced_ns, base.replayed_samples_ns)
    out = [base]
    for name, variant_samples in samples.items():
        if name == "baseline":
            continue
        r = samples_result(_derived(base, name, "replayed", notes.get(name)), variant_samples)
        r.baseline_ns = base.replayed_ns
        r.speedup, r.verdict = judge(variant_samples, samples["baseline"])
        out.append(r)
    return out


def from_exec_trace(torch, item: OpItem, dev) -> Callable:
    """The op rebuilt from its execution trace node (every argument recorded, keyword-only ones by
    name); NotRebuildable without one, or when that fails too."""
    if item.et_node is None or item.kind != "op":
        raise NotRebuildable("no execution trace node (record with --execution-trace)")
    op, inputs = build_nodes(torch, [item.et_node], dev, what="op")
    return lambda: op(*inputs)


class NotApplicable(Exception):
    """The variant does not apply to this op (no float input, no non-contiguous input, ...)."""


_NOTES = {
    "contiguous": "inputs made contiguous once, outside the timed calls: the gain holds when the tensor is produced "
                  "or stored in that layout (a weight, a seq-major activation), not when .contiguous() runs before every call",
    "bmm": "one torch.bmm over the loop's operands stacked once, outside the timed calls",
    "bf16": "floating inputs cast to bfloat16 once, outside the timed calls",
}


def _variant(torch, name: str, item: OpItem, rebuilt: Rebuilt, dev) -> Callable:
    floats = [i for i in rebuilt.tensors if rebuilt.args[i].is_floating_point()]
    if name == "bf16":
        if not floats or all(rebuilt.args[i].dtype == torch.bfloat16 for i in floats):
            raise NotApplicable("no fp32/fp16 floating input to cast")
        args = list(rebuilt.args)
        for i in floats:
            args[i] = args[i].to(torch.bfloat16)
        return _loop(Rebuilt(rebuilt.op, args, rebuilt.tensors), item.loop_len)
    if name.startswith("pad"):
        return _loop(_padded(torch, item, rebuilt, int(name[3:]), dev), item.loop_len)
    if name == "contiguous":
        strided = [i for i in rebuilt.tensors if not rebuilt.args[i].is_contiguous()]
        if not strided:
            raise NotApplicable("every tensor input is already contiguous")
        args = list(rebuilt.args)
        for i in strided:
            args[i] = args[i].contiguous()
        return _loop(Rebuilt(rebuilt.op, args, rebuilt.tensors), item.loop_len)
    if name == "bmm":
        return _batched(torch, item, rebuilt)
    raise NotApplicable(f"unknown variant {name}")


def _padded(torch, item: OpItem, rebuilt: Rebuilt, multiple: int, dev) -> Rebuilt:
    """The matmul with every dimension of its tensor inputs rounded up to `multiple` (bias and batch
    dimensions included: padding is zeros that a real fix would slice off)."""
    if item.name not in PAD_OPS:
        raise NotApplicable(f"padding applies to matmuls ({', '.join(PAD_OPS)}), not {item.name}")
    shapes = [list(rebuilt.args[i].shape) for i in rebuilt.tensors]
    if all(d % multiple == 0 for s in shapes for d in s[-2:]):
        raise NotApplicable(f"every matrix dimension is already a multiple of {multiple}")
    args = list(rebuilt.args)
    for i in rebuilt.tensors:
        t = rebuilt.args[i]
        shape = list(t.shape[:-2]) + [_round_up(d, multiple) for d in t.shape[-2:]]
        args[i] = make_tensor(torch, shape, [], t.dtype, dev)
    return Rebuilt(rebuilt.op, args, rebuilt.tensors)


def _batched(torch, item: OpItem, rebuilt: Rebuilt) -> Callable:
    if item.kind != "op_loop":
        raise NotApplicable("not a loop of same-shape matmuls")
    if item.name not in ("aten::mm", "aten::matmul") or len(rebuilt.tensors) != 2:
        raise NotApplicable(f"batching into bmm applies to loops of aten::mm / aten::matmul of two matrices, not {item.name}")
    a, b = (rebuilt.args[i] for i in rebuilt.tensors)
    if a.dim() != 2 or b.dim() != 2:
        raise NotApplicable("batching into bmm needs 2-D operands")
    a3 = a.unsqueeze(0).expand(item.loop_len, *a.shape).contiguous()
    b3 = b.unsqueeze(0).expand(item.loop_len, *b.shape).contiguous()
    return lambda: torch.bmm(a3, b3)


def _loop(rebuilt: Rebuilt, n: int) -> Callable:
    """The timed unit: one call, or the loop of n calls (each on the same rebuilt operands)."""
    if n == 1:
        return rebuilt

    def loop():
        for _ in range(n):
            rebuilt()
    return loop


def compare(torch, dev, fns: dict[str, Callable], repeats: int, min_time_s: float) -> dict[str, list[float]]:
    """Seconds per call of each function: warm-up grows each one's batch to >= min_time_s (as bprof
    calibrate does), then `repeats` rounds time one batch of every function in turn."""
    calls = {}
    for name, fn in fns.items():
        _time_batch(torch, dev, fn, 1)  # allocation, kernel choice, page faults
        n = 1
        while (elapsed := _time_batch(torch, dev, fn, n)) < min_time_s:
            n = max(n * 2, math.ceil(n * min(100, 1.2 * min_time_s / elapsed))) if elapsed > 0 else n * 100
        calls[name] = n
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            out[name].append(_time_batch(torch, dev, fn, calls[name]) / calls[name])
    return out


@contextlib.contextmanager
def intra_op_threads(torch, num_threads: int | None):
    """torch's intra-op thread count set to what the rank ran with, restored afterwards."""
    previous = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


def _derived(base: ReplayResult, variant: str, status: str, reason: str | None) -> ReplayResult:
    from dataclasses import replace
    return replace(base, variant=variant, status=status, reason=reason, replayed_ns=None, replayed_spread_frac=None,
                   replayed_samples_ns=[], classification=None, num_repeats=0)


def _basis(item: OpItem) -> str:
    unit = "loop of calls" if item.kind == "op_loop" else "call"
    return f"device time of its kernels per {unit}" if item.traced_on == "cuda" else f"op duration per {unit}"


def _round_up(d: int, multiple: int) -> int:
    return max(multiple, -(-d // multiple) * multiple)


def _median(values):
    import statistics
    return statistics.median(values)


