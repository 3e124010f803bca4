"""The counterfactual engine: re-derive a step from its matched collectives with some ranks' work
changed, to price a cause by how much shorter the step would be without it.

Model (per step, aligned clocks). Each rank is a chain: it starts the step, works, arrives at its
first collective, leaves it, works, arrives at the next, ... and after its last collective works
until the end of its span. A collective instance ends for a member `exit` after the LAST member's
arrival (its transfer time as measured, per member): no member leaves before everyone arrived.
Replaying the chains in the order of the measured last arrivals reproduces the measured times
exactly (tested); changing a rank's work and replaying shows how the delay it caused propagates
through every group it shares, and the job's step (the longest rank) gets shorter by `lost_ns`.
The what-if scenarios (bprof.whatif) and the straggler pricing (bprof.analyzers.stragglers) both replay
with it; this module knows nothing about findings or scenarios.

Scale: a 10,240-rank step has about 20 million member rows. Everything here is numpy over those
rows, and the replay's inner loop (a walk over the instances in order, which no array expression
expresses) is compiled with numba.
"""

from __future__ import annotations

import dataclasses
import functools
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np


@dataclasses.dataclass(frozen=True)
class StepGraph:
    """One step: the member rows of its complete instances, sorted by rank and replay order, and each
    rank's span. member arrays have one entry per (instance, rank); span arrays one per rank."""

    instance: np.ndarray  # dense instance index 0..k-1 of each member row
    rank: np.ndarray  # rank of each member row (int32)
    span_rank: np.ndarray  # ranks with a span in this step, ascending
    span_start_ns: np.ndarray  # aligned span start
    span_end_ns: np.ndarray  # aligned span end
    row_span: np.ndarray  # index into the span arrays of each member row's rank
    instance_order: np.ndarray  # instances by measured last arrival
    rows_by_instance: np.ndarray  # member rows grouped by instance, instances in replay order (CSR values) ...
    instance_ptr: np.ndarray  # ... the j-th instance replayed has rows rows_by_instance[instance_ptr[j]:instance_ptr[j + 1]]
    span_by_instance: np.ndarray  # row_span[rows_by_instance]: the replay reads it in sequence
    instance_position: np.ndarray  # position of each dense instance in instance_order
    instance_ids: np.ndarray  # the caller's id of each dense instance index
    source_row: np.ndarray  # for each member row, its index in the arrays given to build()
    last_arrival_ns: np.ndarray  # per dense instance: its latest member arrival
    work_in_order: np.ndarray  # measured work before each member row, in replay order (x[rows_by_instance])
    exit_in_order: np.ndarray  # measured exit after the instance's last arrival, in replay order
    tail_ns: np.ndarray  # measured work after its last exit, per span rank

    @functools.cached_property
    def arrival_ns(self) -> np.ndarray:
        """Each member row's aligned arrival (chain order): rebuilt from the measured work on first
        use, not kept from build (two 20-million-row arrays per step at 10,240 ranks that the
        straggler pricing never reads)."""
        return self._times[0]

    @functools.cached_property
    def end_ns(self) -> np.ndarray:
        """Each member row's aligned exit (chain order), rebuilt like arrival_ns."""
        return self._times[1]

    @functools.cached_property
    def _times(self) -> tuple[np.ndarray, np.ndarray]:
        arrival, end = np.empty(len(self.rank), dtype=np.int64), np.empty(len(self.rank), dtype=np.int64)
        _chain_times(self.instance_ptr, self.instance_order, self.last_arrival_ns, self.span_by_instance,
                     self.rows_by_instance, self.work_in_order, self.exit_in_order, self.span_start_ns, arrival, end)
        return arrival, end

    @classmethod
    def build(cls, instance, rank, arrival_ns, end_ns, span_rank, span_start_ns, span_end_ns,
              instance_ids=None) -> "StepGraph":
        """instance: each member row's instance id - or, when the caller has numbered the instances
        itself and gives their ids as `instance_ids`, each row's index into it (no sort needed)."""
        # int32 ranks and instance indices (as the store returns them) stay int32: 20 million rows
        # converted to int64 and gathered cost a second per step at 10,240 ranks
        instance, rank = np.asarray(instance), np.asarray(rank)
        rank = rank if rank.dtype == np.int32 else rank.astype(np.int64)
        if len(rank) and (rank.min() < 0 or rank.max() >= 1 << 31):
            raise ValueError("ranks outside 0..2^31-1")
        arrival_ns, end_ns = np.asarray(arrival_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64)
        span_rank = np.asarray(span_rank, dtype=np.int64)
        by_rank = np.argsort(span_rank, kind="stable")
        span_rank = span_rank[by_rank]
        span_start = np.asarray(span_start_ns, dtype=np.int64)[by_rank]
        span_end = np.asarray(span_end_ns, dtype=np.int64)[by_rank]
        if instance_ids is None:
            ids, dense, last = _dense_instances(instance, arrival_ns)
        else:
            ids = np.asarray(instance_ids)
            dense = instance if instance.dtype in (np.int32, np.int64) else instance.astype(np.int64)
            if len(dense) and (dense.min() < 0 or dense.max() >= len(ids)):
                raise ValueError("instance indices outside instance_ids")
            last = _latest_by(dense, arrival_ns, len(ids))
        # Each rank's chain follows the order instances are replayed in (their last arrival, then
        # their dense index), not its own arrivals: with asynchronous collectives (several NCCL
        # streams) a rank can arrive at B before A completes; the chain then counts B's work from A's
        # exit, which may be negative, and the replay of unchanged work stays exact - also when two
        # instances of a rank end their arrivals at the same instant, because a rank's previous row
        # in its chain is its previous row in the replay.
        instance_order = np.argsort(last, kind="stable")  # by last arrival, then dense index
        position = np.empty(len(ids), dtype=np.int64)
        position[instance_order] = np.arange(len(ids))
        # row indices fit 32 bits below 2^31 rows (20 million per step at 10,240 ranks): half the memory
        idx = np.int32 if len(rank) < 1 << 31 and len(ids) < 1 << 31 else np.int64
        by_pos = np.empty(len(rank), dtype=idx)  # the caller's rows in replay order
        if len(rank) and rank.max() < 1 << 24:
            order, by_inst = np.empty(len(rank), dtype=idx), np.empty(len(rank), dtype=idx)
            ptr = _chain_and_replay_order(rank, position, dense, int(rank.max()) + 1, by_pos, order, by_inst)
        else:
            order = np.lexsort((position[dense], rank)).astype(idx)  # ranks beyond any real job
            _, ptr = _rows_by_position(position, dense, by_pos)
            chain_of = np.empty(len(rank), dtype=idx)
            chain_of[order] = np.arange(len(rank), dtype=idx)
            by_inst = chain_of[by_pos]
        g_dense, g_rank = _take(dense, order), _take(rank, order)
        # rows are sorted by rank: look up each run of a rank once
        starts = np.flatnonzero(np.r_[True, g_rank[1:] != g_rank[:-1]]) if len(g_rank) else np.zeros(0, dtype=np.int64)
        run_rank = g_rank[starts]
        run_span = np.searchsorted(span_rank, run_rank)
        if len(run_rank) and (run_span.max() >= len(span_rank) or (span_rank[run_span] != run_rank).any()):
            missing = sorted(set(run_rank.tolist()) - set(span_rank.tolist()))
            raise ValueError(f"ranks {missing[:5]} join collectives of the step but have no span in it")
        row_span = np.repeat(run_span.astype(idx), np.diff(np.r_[starts, len(g_rank)]))
        # what was measured, in replay order: one walk over the caller's rows in that order (which
        # the store returns close to it), instead of gathers through the chain order
        span_by_instance = _take(row_span, by_inst)
        work_in_order, exit_in_order = np.empty(len(rank), dtype=np.int64), np.empty(len(rank), dtype=np.int64)
        last_end = _measured_in_order(by_pos, ptr, instance_order, last, arrival_ns, end_ns, span_by_instance,
                                      span_start, work_in_order, exit_in_order)
        return cls(g_dense.astype(idx, copy=False), g_rank.astype(np.int32, copy=False), span_rank,
                   span_start, span_end, row_span, instance_order, by_inst, ptr, span_by_instance, position, ids,
                   order, last, work_in_order, exit_in_order, span_end - last_end)

    def members(self, k: int) -> np.ndarray:
        """The member rows of dense instance k."""
        j = self.instance_position[k]
        return self.rows_by_instance[self.instance_ptr[j]:self.instance_ptr[j + 1]]


@dataclasses.dataclass(frozen=True)
class Replay:
    rank: np.ndarray  # ranks of the step
    end_ns: np.ndarray  # replayed end of each rank's span
    step_ns: int  # the job's step: latest replayed end - earliest span start


def work_segments(g: StepGraph) -> tuple[np.ndarray, np.ndarray]:
    """(work before each member row, tail work per span rank): what each rank does on its own; the
    work is the measured work in replay order put back in chain order."""
    return _by_row(g, g.work_in_order), g.tail_ns


def _by_row(g: StepGraph, in_order: np.ndarray) -> np.ndarray:
    """x with x[g.rows_by_instance] = in_order: values in replay order, by member row."""
    return _scatter(in_order, g.rows_by_instance, np.empty(len(in_order), dtype=in_order.dtype))


@numba.njit(cache=True, nogil=True, parallel=True)
def _scatter(values, index, out):  # pragma: no cover - compiled
    """out[index] = values on every core (index: a permutation, so no two writes meet)."""
    for i in numba.prange(len(index)):
        out[index[i]] = values[i]
    return out


def replay_positions(g: StepGraph, rows: np.ndarray) -> np.ndarray:
    """Where each of `rows` sits in replay order (rows_by_instance[position] == row): found in its
    instance's block, for the few rows a caller changes, instead of a 20-million-row scatter."""
    rows = np.asarray(rows, dtype=g.rows_by_instance.dtype)
    return _replay_positions(rows, g.instance, g.instance_position, g.instance_ptr, g.rows_by_instance)


@numba.njit(cache=True, nogil=True)
def _replay_positions(rows, instance, instance_position, ptr, rows_by_instance):  # pragma: no cover - compiled
    out = np.empty(len(rows), dtype=np.int64)
    for i in range(len(rows)):
        k = instance_position[instance[rows[i]]]
        out[i] = -1
        for j in range(ptr[k], ptr[k + 1]):  # a block holds one row per member: a group's size
            if rows_by_instance[j] == rows[i]:
                out[i] = j
                break
    return out


@numba.njit(cache=True, nogil=True, parallel=True)
def _take(values, index):  # pragma: no cover - compiled
    """values[index] on every core: the gathers of a step's 20 million rows wait on memory, not
    on arithmetic, and the cores are otherwise idle while the step is built."""
    out = np.empty(len(index), dtype=values.dtype)
    for i in numba.prange(len(index)):
        out[i] = values[index[i]]
    return out


def exit_offsets(g: StepGraph) -> np.ndarray:
    """Each member's exit after the last arrival of its instance: the transfer it saw."""
    return _by_row(g, g.exit_in_order)


def replay(g: StepGraph, work: np.ndarray | None = None, tail: np.ndarray | None = None,
           exit_after_ns: np.ndarray | None = None) -> Replay:
    """Replay the step with the given work and transfers (default: as measured); each exit follows
    the last arrival of its instance by `exit_after_ns`."""
    if work is None and tail is None and exit_after_ns is None:
        return replay_in_order(g, g.work_in_order, g.exit_in_order, g.tail_ns)
    if work is None or tail is None:
        base_work, base_tail = work_segments(g)
        work = base_work if work is None else work
        tail = base_tail if tail is None else tail
    exit_after_ns = exit_offsets(g) if exit_after_ns is None else exit_after_ns
    return replay_in_order(g, np.asarray(work, dtype=np.int64)[g.rows_by_instance],
                           np.asarray(exit_after_ns, dtype=np.int64)[g.rows_by_instance], tail)


def replay_in_order(g: StepGraph, work_in_order: np.ndarray, exit_after_in_order: np.ndarray, tail: np.ndarray) -> Replay:
    """replay() with work and exits already in replay order (x[g.rows_by_instance]): a caller
    replaying many variants of one step gathers once and changes a few entries per variant."""
    none = np.zeros(0, dtype=np.int64)
    exits = _replay_exits_many(g.instance_ptr, g.span_by_instance, work_in_order, exit_after_in_order, g.span_start_ns,
                               none, none, np.zeros(2, dtype=np.int64))[:, 0]
    ends = exits + np.asarray(tail, dtype=np.int64)
    step_ns = int(ends.max() - g.span_start_ns.min()) if len(ends) else 0
    return Replay(g.span_rank, ends, step_ns)


def replay_many(g: StepGraph, work_in_order: np.ndarray, exit_in_order: np.ndarray,
                changes: list[tuple[np.ndarray, np.ndarray, np.ndarray]], threads: int = 2) -> list[int]:
    """The job's step (step_ns) replayed once per change, each change (positions in replay order,
    their work there, tail per span rank) applied to the work alone: one walk over the rows for
    all changes (the rows are read once, not once per change), the changes split over `threads`
    threads (compiled, without the GIL)."""
    if not changes:
        return []
    parts = [list(range(len(changes)))[k::threads] for k in range(min(threads, len(changes)))]

    def walk(part: list[int]) -> np.ndarray:
        at, work, counts = [], [], [0]
        for i in part:
            where = np.asarray(changes[i][0], dtype=np.int64)
            by_position = np.argsort(where, kind="stable")
            at.append(where[by_position])
            work.append(np.asarray(changes[i][1], dtype=np.int64)[by_position])
            counts.append(len(where))
        return _replay_exits_many(g.instance_ptr, g.span_by_instance, work_in_order, exit_in_order, g.span_start_ns,
                                  np.concatenate(at), np.concatenate(work), np.cumsum(counts))

    if len(parts) > 1:
        with ThreadPoolExecutor(len(parts)) as pool:
            exits = list(pool.map(walk, parts))
    else:
        exits = [walk(parts[0])]
    out = [0] * len(changes)
    start = int(g.span_start_ns.min()) if len(g.span_start_ns) else 0
    for part, prev in zip(parts, exits):
        for t, i in enumerate(part):
            ends = prev[:, t] + np.asarray(changes[i][2], dtype=np.int64)
            out[i] = int(ends.max() - start) if len(ends) else 0
    return out


@numba.njit(cache=True, nogil=True)
def _replay_exits_many(ptr, span, work, exit_after, span_start, change_at, change_work, change_ptr):  # pragma: no cover - compiled
    """Algorithm: instances in the order of their measured last arrival (a topological order: an
    instance depends only on instances its members left before arriving at it); the arrays hold the
    member rows in that order, so the walk reads them in sequence. A member arrives at its rank's
    previous exit plus its work; the instance's exits follow its latest arrival. Several variants of
    the work at once (variant t replaces the work at positions change_at[change_ptr[t]:change_ptr[t + 1]],
    ascending; one variant without changes is the plain replay): each span rank keeps one exit per
    variant, side by side, so a row is read once for all of them. Returns the span ranks' last exits
    (their span start when they joined nothing), one column per variant."""
    variants = len(change_ptr) - 1
    prev_exit = np.empty((len(span_start), variants), dtype=np.int64)
    for s in range(len(span_start)):
        for t in range(variants):
            prev_exit[s, t] = span_start[s]
    cursor = change_ptr[:-1].copy()
    latest = np.empty(variants, dtype=np.int64)
    for k in range(len(ptr) - 1):
        latest[:] = np.iinfo(np.int64).min
        for j in range(ptr[k], ptr[k + 1]):
            s = span[j]
            for t in range(variants):
                w = work[j]
                c = cursor[t]
                if c < change_ptr[t + 1] and change_at[c] == j:
                    w = change_work[c]
                    cursor[t] = c + 1
                arrive = prev_exit[s, t] + w
                if arrive > latest[t]:
                    latest[t] = arrive
        for j in range(ptr[k], ptr[k + 1]):
            s = span[j]
            for t in range(variants):
                prev_exit[s, t] = latest[t] + exit_after[j]
    return prev_exit


@numba.njit(cache=True, nogil=True)
def _chain_and_replay_order(rank, position, dense, num_ranks, by_pos, order, by_inst):  # pragma: no cover - compiled
    """The rows in replay order (by_pos: grouped by their instance's replay position, each group in
    row order), in chain order (order: by rank, then replay position - a stable counting sort of
    by_pos by rank) and, for each replay position, the row's place in chain order (by_inst): a
    radix sort of (rank, position), two linear passes. by_pos, order, by_inst: empty arrays of
    len(rank) integers (int32 below 2^31 rows). Returns each replayed instance's start in by_pos."""
    n = len(rank)
    _, ptr = _rows_by_position(position, dense, by_pos)
    start = np.zeros(num_ranks + 1, dtype=np.int64)
    for i in range(n):
        start[rank[i] + 1] += 1
    for r in range(num_ranks):
        start[r + 1] += start[r]
    for j in range(n):
        i = by_pos[j]
        p = start[rank[i]]
        order[p] = i
        by_inst[j] = p
        start[rank[i]] = p + 1
    return ptr


@numba.njit(cache=True, nogil=True, parallel=True)
def _measured_in_order(by_pos, ptr, instance_order, last, arrival, end, span, span_start, work, exit_after):  # pragma: no cover - compiled
    """Walk the rows in replay order (by_pos: the caller's rows; span: each one's span index):
    a row's work runs from its rank's previous exit in the replay (its span start for the first),
    which is its previous row in its chain; its exit follows its instance's last arrival. Fills
    work and exit_after; returns each span rank's last exit (its span start when it joined nothing).
    The gathers from the caller's rows (a jump per instance) run on every core, the walk after them
    reads in sequence."""
    for k in numba.prange(len(ptr) - 1):
        latest = last[instance_order[k]]
        for j in range(ptr[k], ptr[k + 1]):
            i = by_pos[j]
            work[j] = arrival[i]
            exit_after[j] = end[i] - latest
    last_end = span_start.copy()
    for k in range(len(ptr) - 1):
        latest = last[instance_order[k]]
        for j in range(ptr[k], ptr[k + 1]):
            s = span[j]
            work[j] -= last_end[s]
            last_end[s] = latest + exit_after[j]
    return last_end


@numba.njit(cache=True, nogil=True)
def _chain_times(ptr, instance_order, last, span, rows, work, exit_after, span_start, arrival, end):  # pragma: no cover - compiled
    """The inverse of _measured_in_order: replaying the measured work reproduces every arrival and
    exit exactly; each is written at its row's place in chain order (rows: rows_by_instance)."""
    prev_exit = span_start.copy()
    for k in range(len(ptr) - 1):
        latest = last[instance_order[k]]
        for j in range(ptr[k], ptr[k + 1]):
            s = span[j]
            arrival[rows[j]] = prev_exit[s] + work[j]
            e = latest + exit_after[j]
            end[rows[j]] = e
            prev_exit[s] = e
    return arrival, end


@numba.njit(cache=True, nogil=True)
def _rows_by_position(position, dense, rows):  # pragma: no cover - compiled
    """_counting_sort(position[dense], len(position)) into `rows` (len(dense) integers): the rows
    grouped by their instance's replay position, each group in row order; and each group's start."""
    ptr = np.zeros(len(position) + 1, dtype=np.int64)
    for i in range(len(dense)):
        ptr[position[dense[i]] + 1] += 1
    for k in range(len(position)):
        ptr[k + 1] += ptr[k]
    fill = ptr[:-1].copy()
    for i in range(len(dense)):
        p = position[dense[i]]
        rows[fill[p]] = i
        fill[p] += 1
    return rows, ptr


def _dense_instances(instance: np.ndarray, arrival_ns: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sorted distinct ids, each row's dense index, each instance's latest arrival): one sort."""
    perm = np.argsort(instance, kind="stable")
    sorted_ids = instance[perm]
    new = np.ones(len(perm), dtype=bool)
    new[1:] = sorted_ids[1:] != sorted_ids[:-1]
    starts = np.flatnonzero(new)
    dense = np.empty(len(perm), dtype=np.int64)
    dense[perm] = np.cumsum(new) - 1
    last = np.maximum.reduceat(arrival_ns[perm], starts) if len(perm) else np.zeros(0, dtype=np.int64)
    return sorted_ids[starts], dense, last


@numba.njit(cache=True, nogil=True)
def _latest_by(index, values, n):  # pragma: no cover - compiled
    """Per index 0..n-1, the largest of its values (int64 min when it has none)."""
    out = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    for i in range(len(index)):
        if values[i] > out[index[i]]:
            out[index[i]] = values[i]
    return out


@numba.njit(cache=True, nogil=True)
def _counting_sort(keys, num_keys):  # pragma: no cover - compiled
    """Stable order of rows by integer key 0..num_keys-1, and each key's start in it (CSR)."""
    ptr = np.zeros(num_keys + 1, dtype=np.int64)
    for k in keys:
        ptr[k + 1] += 1
    for k in range(num_keys):
        ptr[k + 1] += ptr[k]
    fill = ptr[:-1].copy()
    rows = np.empty(len(keys), dtype=np.int64)
    for i in range(len(keys)):
        rows[fill[keys[i]]] = i
        fill[keys[i]] += 1
    return rows, ptr
