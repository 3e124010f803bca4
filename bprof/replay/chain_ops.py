"""Chain replay: rerun a recorded op sequence (bprof.replay.chains) eagerly, and compiled with torch.compile.

The chain is rebuilt from its execution trace nodes (bprof.replay.et_rebuild). The compile variant
is checked against eager on copies of the same inputs before it is timed: a fix that changes the
results is reported as failed, not as faster. Compilation happens before the timed calls, and its
seconds are reported. torch is imported inside the functions.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from bprof.replay.chains import ChainItem
from bprof.replay.et_rebuild import build_nodes, first_line
from bprof.replay.ops import _derived, compare, judged
from bprof.replay.plan import spread_of
from bprof.replay.rebuild import NotRebuildable
from bprof.replay.results import ReplayResult

def replay_chain(torch, item: ChainItem, dev, variants: tuple[str, ...], repeats: int, min_time_s: float,
                 num_threads: int | None) -> list[ReplayResult]:
    """The eager replay of the chain and, if asked, its torch.compile variant; one ReplayResult each."""
    nodes = [json.loads(n[2] or "{}") for n in item.nodes]
    base = ReplayResult(item.kind, item.label, item.key, item.rank, "baseline", "not_rebuildable", dev.type,
                        shapes=[n.get("shapes") for n in nodes], dtypes=[n.get("types") for n in nodes],
                        strides=[n.get("strides") for n in nodes], num_threads=num_threads,
                        calls_per_step=item.calls_per_step, traced_ns=int(_median(item.traced_ns)),
                        traced_spread_frac=spread_of(item.traced_ns), traced_basis=_basis(item),
                        finding_id=item.finding_id, finding_title=item.finding_title)
    try:
        chain, inputs = build_chain(torch, item, dev)
    except NotRebuildable as exc:
        base.reason = str(exc)
        return [base]
    fns: dict[str, Callable] = {"baseline": lambda: chain(*inputs)}
    out: list[ReplayResult] = []
    notes: dict[str, str] = {}
    if "compile" in variants:
        compiled, problem, seconds = _compiled(torch, chain, inputs)
        if problem:
            out.append(_derived(base, "compile", "failed", problem))
        else:
            fns["compile"] = lambda: compiled(*inputs)
            notes["compile"] = f"torch.compile (inductor) of the chain as one function; compiled in {seconds:.1f} s, before the timed calls"
    try:
        samples = compare(torch, dev, fns, repeats, min_time_s)
    except Exception as exc:  # the chain failed when run for real
        base.status, base.reason = "failed", first_line(exc)
        return [base]
    return judged(base, item.traced_ns, samples, notes) + out


def build_chain(torch, item: ChainItem, dev) -> tuple[Callable, list]:
    """(chain, inputs): chain(*inputs) runs the ops in order and returns the tensors it wrote that no
    later op of the chain read (and the last op's). NotRebuildable says which argument is missing."""
    return build_nodes(torch, item.nodes, dev)


def _compiled(torch, chain: Callable, inputs: list) -> tuple[Callable | None, str | None, float]:
    """(compiled chain, None, seconds to compile) or (None, why it cannot stand in for the chain, seconds)."""
    t0 = time.perf_counter()
    try:
        compiled = torch.compile(chain, dynamic=False)
        got = compiled(*[t.clone() for t in inputs])
    except Exception as exc:
        return None, f"torch.compile failed: {first_line(exc)}", time.perf_counter() - t0
    seconds = time.perf_counter() - t0
    want = chain(*[t.clone() for t in inputs])
    for k, (a, b) in enumerate(zip(got, want)):
        if a.shape != b.shape or a.dtype != b.dtype:
            return None, f"the compiled chain's output {k} is {tuple(a.shape)} {a.dtype}, eager's {tuple(b.shape)} {b.dtype}", seconds
        if a.is_floating_point() and not torch.allclose(a.float(), b.float(), rtol=1e-3, atol=1e-4, equal_nan=True):
            worst = (a.float() - b.float()).abs().max().item()
            return None, f"the compiled chain's output {k} differs from eager's by up to {worst:.3g}", seconds
    return compiled, None, seconds


def _basis(item: ChainItem) -> str:
    what = "device time of the kernels its ops launched" if item.traced_on == "cuda" else "sum of its ops' durations"
    return f"{what} per chain"


def _median(values):
    import statistics
    return statistics.median(values)
