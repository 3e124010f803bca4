"""The counterfactual engine: re-derive a step from its matched collectives with some ranks' work
changed, to price a cause by how much shorter the step would be without it.

Model (per step, aligned clocks). Each rank is a chain: it starts the step, works, arrives at its
first collective, leaves it, works, arrives at the next, ... and after its last collective works
until the end of its span. A collective instance ends for a member `exit` after the LAST member's
arrival (its transfer time as measured, per member): no member leaves before everyone arrived.
Replaying the chains in the order of the measured last arrivals reproduces the measured times
exactly (tested); changing a rank's work and replaying shows how the delay it caused propagates
through every group it shares, and the job's step (the longest rank) gets shorter by `lost_ns`.
The what-if engine generalises this one; this module knows nothing about findings.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class StepGraph:
    """One step: the member rows of its complete instances, sorted by rank and replay order, and each
    rank's span. member arrays have one entry per (instance, rank); span arrays one per rank."""

    instance: np.ndarray  # dense instance index 0..k-1 of each member row
    rank: np.ndarray  # rank of each member row
    arrival_ns: np.ndarray  # aligned arrival
    end_ns: np.ndarray  # aligned exit
    span_rank: np.ndarray  # ranks with a span in this step
    span_start_ns: np.ndarray  # aligned span start
    span_end_ns: np.ndarray  # aligned span end
    rows_by_instance: list  # member rows of each instance
    instance_order: np.ndarray  # instances by measured last arrival
    instance_ids: list  # the caller's id of each dense instance index

    @classmethod
    def build(cls, instance, rank, arrival_ns, end_ns, span_rank, span_start_ns, span_end_ns) -> "StepGraph":
        instance, rank = np.asarray(instance), np.asarray(rank, dtype=np.int64)
        arrival_ns, end_ns = np.asarray(arrival_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64)
        ids, dense = np.unique(instance, return_inverse=True)
        last = _instance_max(dense, arrival_ns)
        # Each rank's chain follows the order instances are replayed in (their last arrival), not its
        # own arrivals: with asynchronous collectives (several NCCL streams) a rank can arrive at B
        # before A completes; the chain then counts B's work from A's exit, which may be negative,
        # and the replay of unchanged work stays exact.
        order = np.lexsort((dense, arrival_ns, last[dense], rank))  # ties broken by instance: deterministic
        dense, g_rank, g_arr, g_end = dense[order], rank[order], arrival_ns[order], end_ns[order]
        by_inst = np.argsort(dense, kind="stable")
        bounds = np.flatnonzero(np.diff(dense[by_inst])) + 1
        rows = np.split(by_inst, bounds) if len(by_inst) else []
        return cls(dense, g_rank, g_arr, g_end, np.asarray(span_rank, dtype=np.int64),
                   np.asarray(span_start_ns, dtype=np.int64), np.asarray(span_end_ns, dtype=np.int64),
                   rows, np.lexsort((np.arange(len(last)), last)), ids.tolist())


@dataclasses.dataclass(frozen=True)
class Replay:
    rank: np.ndarray  # ranks of the step
    end_ns: np.ndarray  # replayed end of each rank's span
    step_ns: int  # the job's step: latest replayed end - earliest span start


def work_segments(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """(work before each member row, tail work per span rank): what each rank does on its own."""
    start = dict(zip(g.span_rank.tolist(), g.span_start_ns.tolist()))
    n = len(g.rank)
    first = np.ones(n, dtype=bool)
    first[1:] = g.rank[1:] != g.rank[:-1]
    prev_end = np.empty(n, dtype=np.int64)
    prev_end[1:] = g.end_ns[:-1]
    prev_end[first] = [start[r] for r in g.rank[first].tolist()]
    work = g.arrival_ns - prev_end
    last_end = dict(zip(g.rank.tolist(), g.end_ns.tolist()))  # rows are in chain order: the last one wins
    tail = np.array([e - last_end.get(r, s) for r, s, e in zip(g.span_rank.tolist(), g.span_start_ns.tolist(),
                                                               g.span_end_ns.tolist())], dtype=np.int64)
    return work, tail


def exit_offsets(g: StepGraph) -> np.ndarray:
    """Each member's exit after the last arrival of its instance: the transfer it saw."""
    return g.end_ns - _instance_max(g.instance, g.arrival_ns)[g.instance]


def replay(g: StepGraph, work: np.ndarray | None = None, tail: np.ndarray | None = None,
           exit_after_ns: np.ndarray | None = None) -> Replay:
    """Replay the step with the given work and transfers (default: as measured); each exit follows
    the last arrival of its instance by `exit_after_ns`."""
    if work is None or tail is None:
        base_work, base_tail = work_segments(g)
        work = base_work if work is None else work
        tail = base_tail if tail is None else tail
    exit_after_ns = exit_offsets(g) if exit_after_ns is None else exit_after_ns
    # Algorithm: instances in the order of their measured last arrival (a topological order: an
    # instance depends only on instances its members left before arriving at it). A member arrives at
    # its rank's previous exit plus its work; the instance's exits follow its latest arrival.
    prev_exit = dict(zip(g.span_rank.tolist(), g.span_start_ns.tolist()))
    ranks, works, exits = g.rank.tolist(), work.tolist(), exit_after_ns.tolist()
    for inst in g.instance_order.tolist():
        rows = g.rows_by_instance[inst].tolist()
        latest = max(prev_exit[ranks[i]] + works[i] for i in rows)
        for i in rows:
            prev_exit[ranks[i]] = latest + exits[i]
    ends = np.array([prev_exit[r] + t for r, t in zip(g.span_rank.tolist(), tail.tolist())], dtype=np.int64)
    return Replay(g.span_rank, ends, int(ends.max() - g.span_start_ns.min()))


def _instance_max(instance: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.full(int(instance.max()) + 1 if len(instance) else 0, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(out, instance, values)
    return out
