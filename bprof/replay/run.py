"""`bprof replay` as a library call: plan the items of a run, replay them here, store the results."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import duckdb

from bprof.errors import DeviceError, UsageError
from bprof.replay.plan import Plan, make_plan
from bprof.replay.results import ReplayResult, save

from bprof.replay.plan import COLLECTIVE_VARIANTS

VARIANTS = ("bf16", "pad8", "pad64", "pad128", "contiguous", "bmm", "compile", *COLLECTIVE_VARIANTS)
DEFAULT_VARIANTS = VARIANTS


@dataclass(frozen=True)
class ReplayOptions:
    run: str | None = None
    top: int = 5
    op: str | None = None
    collectives_only: bool = False
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    device: str | None = None          # default: the kind of device the run was traced on
    repeats: int = 7
    min_time_s: float = 0.02           # each timed batch lasts at least this long
    max_ranks: int | None = None       # collective replay: at most this many ranks (default: CPU count / GPUs)
    together: int = 1                  # op and chain replays: processes running the item at once (CPU), as ranks shared a host
    dry_run: bool = False              # list what would be replayed and whether it can be rebuilt; run nothing


def replay(con: duckdb.DuckDBPyConnection, options: ReplayOptions,
           progress: Callable[[str], None] | None = None) -> tuple[Plan, list[ReplayResult]]:
    """Replay the run's chosen items on this machine; results are stored unless it is a dry run."""
    for v in options.variants:
        if v not in VARIANTS:
            raise UsageError(f"unknown variant {v!r} (one of {', '.join(VARIANTS)})")
    for label, value in (("--top", options.top), ("--repeats", options.repeats), ("--together", options.together)):
        if value < 1:
            raise UsageError(f"{label} must be at least 1, not {value}")
    torch = _import_torch()
    say = progress or (lambda message: None)
    plan = make_plan(con, options.run, top=options.top, op=options.op, ops=not options.collectives_only)
    traced_on = plan.ops[0].traced_on if plan.ops else plan.chains[0].traced_on if plan.chains else "cpu"
    device = options.device or traced_on
    if options.together > 1 and device.startswith("cuda"):
        raise UsageError("--together applies to CPU replays: on a GPU host each rank has its own device")
    dev = _device(torch, "meta" if options.dry_run else device)
    if options.dry_run:
        return plan, _listing(torch, plan, dev)
    results: list[ReplayResult] = []
    from bprof.replay.chain_ops import replay_chain
    from bprof.replay.ops import intra_op_threads, replay_op
    from bprof.replay.together import neighbours

    op_variants = tuple(v for v in options.variants if v not in COLLECTIVE_VARIANTS)
    with intra_op_threads(torch, plan.intra_op_threads if dev.type == "cpu" else None) as threads:
        for k, item in enumerate(plan.ops + plan.chains):
            chain = item.kind == "op_chain"
            say(f"{'chain' if chain else 'op'} {k + 1}/{len(plan.ops) + len(plan.chains)}: {item.label}"
                + (" (compiling)" if chain and "compile" in op_variants else ""))
            with neighbours(item, options.together - 1, threads) as running:
                rows = (replay_chain if chain else replay_op)(torch, item, dev, op_variants, options.repeats,
                                                             options.min_time_s, threads)
            for r in rows:
                r.together = 1 + running
            if running < options.together - 1:
                for r in rows:
                    r.reason = "; ".join(filter(None, [r.reason, f"{running} of {options.together - 1} neighbours ran"]))
            results += rows
    if plan.collectives:
        from bprof.replay.comm import replay_collectives

        say(f"{len(plan.collectives)} collective(s) in a {'nccl' if dev.type == 'cuda' else 'gloo'} process group")
        results += replay_collectives(plan.collectives, device=dev.type, repeats=options.repeats, max_ranks=options.max_ranks,
                                      num_threads=plan.intra_op_threads,
                                      variants=tuple(v for v in options.variants if v in COLLECTIVE_VARIANTS),
                                      min_time_s=options.min_time_s)
    if traced_on != dev.type:
        for r in results:
            r.reason = "; ".join(filter(None, [r.reason, f"traced on {traced_on}, replayed on {dev.type}: times are not comparable"]))
            r.classification = None
    save(con, plan.run_id, results)
    return plan, results


def _listing(torch, plan: Plan, dev) -> list[ReplayResult]:
    """Each op item rebuilt on the meta device (shapes, dtypes and strides checked, nothing run)."""
    from bprof.replay.ops import _basis, from_exec_trace
    from bprof.replay.plan import spread_of
    from bprof.replay.rebuild import NotRebuildable, rebuild
    import statistics

    out = []
    for item in plan.ops:
        r = ReplayResult(item.kind, item.label, item.key, item.rank, "baseline", "rebuildable", item.traced_on,
                         shapes=item.dims, dtypes=item.types, strides=item.strides, calls_per_step=item.calls_per_step,
                         traced_ns=int(statistics.median(item.traced_ns)), traced_spread_frac=spread_of(item.traced_ns),
                         traced_basis=_basis(item), finding_id=item.finding_id, finding_title=item.finding_title)
        try:
            rebuild(torch, item.name, item.dims, item.types, item.strides, item.concrete, dev)
        except NotRebuildable as exc:
            try:
                from_exec_trace(torch, item, dev)
                r.reason = f"rebuilt from the execution trace (its Kineto signature is not enough: {exc})"
            except NotRebuildable as et_exc:
                r.status, r.reason = "not_rebuildable", str(exc) + (f"; from the execution trace: {et_exc}" if item.et_node else
                                        "; recorded with --execution-trace, it could be rebuilt from the execution trace")
        out.append(r)
    if plan.chains:
        from bprof.replay.chain_ops import _basis as chain_basis, build_chain
    for item in plan.chains:
        r = ReplayResult(item.kind, item.label, item.key, item.rank, "baseline", "rebuildable", item.traced_on,
                         calls_per_step=item.calls_per_step, traced_ns=int(statistics.median(item.traced_ns)),
                         traced_spread_frac=spread_of(item.traced_ns), traced_basis=chain_basis(item))
        try:
            build_chain(torch, item, dev)
        except NotRebuildable as exc:
            r.status, r.reason = "not_rebuildable", str(exc)
        out.append(r)
    for item in plan.collectives:
        out.append(ReplayResult(item.kind, item.label, item.key, item.rank, "baseline", "rebuildable", "gloo/nccl",
                                shapes=item.elems, dtypes=[item.dtype], group_size=item.group_size,
                                traced_ns=int(statistics.median(item.traced_ns)), traced_basis=item.traced_basis,
                                finding_id=item.finding_id, finding_title=item.finding_title))
    return out


def _device(torch, device: str):
    from bprof.replay.calibrate import _device as checked

    if device == "meta":
        return torch.device("meta")
    return checked(torch, device)


def _import_torch():
    try:
        import torch
    except ImportError:
        raise UsageError("bprof replay needs torch: pip install 'bprof[capture]'") from None
    return torch
