"""Replays under the conditions of a shared host: neighbour processes run the same item while it is timed.

Ranks of one job share their host's cores, caches and memory bandwidth; an op timed alone on an
idle machine misses that. `bprof replay --together N` starts N - 1 neighbour processes (spawned, each
with the rank's intra-op thread count) that rebuild the item as recorded and run it in a loop until
the timing is done, so the replay meets the contention of N ranks doing the same work. CPU only: on a
GPU host every rank has its own device. torch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue

READY_TIMEOUT_S = 300  # a neighbour imports torch and rebuilds the item (compiles nothing) before it is ready


@contextlib.contextmanager
def neighbours(item, count: int, num_threads: int | None):
    """`count` processes running `item` in a loop on this host's CPU while the block runs; yields how
    many are running (those that could not rebuild the item, or did not get ready in time, are not)."""
    if count <= 0:
        yield 0
        return
    ctx = multiprocessing.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_loop, args=(item, num_threads, stop, ready), daemon=True) for _ in range(count)]
    for p in procs:
        p.start()
    running = 0
    try:
        for _ in procs:
            try:
                running += ready.get(timeout=READY_TIMEOUT_S) is None
            except queue.Empty:
                break
        yield running
    finally:
        stop.set()
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
                p.join()


def _loop(item, num_threads: int | None, stop, ready) -> None:
    """A neighbour: rebuild `item` on the CPU, say so on `ready` (None, or why not), run it until `stop`."""
    import torch

    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        fn = _callable(torch, item)
        fn()
    except Exception as exc:  # the main replay reports the same failure with the item
        ready.put(f"{type(exc).__name__}: {exc}")
        return
    ready.put(None)
    while not stop.is_set():
        fn()


def _callable(torch, item):
    device = torch.device("cpu")
    if item.kind == "op_chain":
        from bprof.replay.chain_ops import build_chain

        chain, inputs = build_chain(torch, item, device)
        return lambda: chain(*inputs)
    from bprof.replay.ops import _loop as loop_of, from_exec_trace
    from bprof.replay.rebuild import NotRebuildable, rebuild

    try:
        return loop_of(rebuild(torch, item.name, item.dims, item.types, item.strides, item.concrete, device), item.loop_len)
    except NotRebuildable:
        return from_exec_trace(torch, item, device)
