"""The counterfactual engine: re-derive a step from its matched collectives with some ranks' work
changed, to price a cause by how much shorter the step would be without it.

Model (per step, aligned clocks). Each rank is a chain of member rows, one per collective it joins;
each row has three times: the issue (when the rank's training thread issued the call; on a device
timeline, the arrival), the arrival (when its transfer could start on that rank) and the exit. A
collective instance ends for a member `exit` after the LAST member's arrival (its transfer time as
measured, per member): no member leaves before everyone arrived.
- An issue is anchored to the event that released it: the latest of its rank's earlier issues and
  of the exits its host waited for (the thread idle as they ended) among its previous ANCHOR_DEPTH
  rows, at or before it, measured; the first row's to the span start. Its work is the time from
  that anchor. A synchronous collective's successor is released by its exit; a collective issued
  while others are in flight (DDP's buckets from autograd hooks, FSDP's prefetch, `async_op=True`)
  by the rank's previous issue - the host went on working - so a peer's delay on an earlier
  collective never enters its work as a negative time.
- An arrival follows its issue, unless the call queued behind an exit of its rank (one ended after
  it was issued and before it started: a busy worker thread or stream): then it follows that exit,
  and never precedes its issue.
- The span's end is anchored like an issue (usually to the last exit, which the host waits for).
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

# How many of a rank's previous rows in its chain an issue or arrival may be anchored to (beyond
# them, the previous exit): DDP issues a bucket while the previous one or two are in flight.
ANCHOR_DEPTH = 8
# An anchor is 0 (the span start) or back * 4 + kind: the issue (kind 0) or exit (kind 1) of the
# row `back` rows before in the rank's chain.
ISSUE, EXIT = 0, 1


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
    work_in_order: np.ndarray  # measured work before each member row's issue (from its anchor), in replay order (x[rows_by_instance])
    exit_in_order: np.ndarray  # measured exit after the instance's last arrival, in replay order
    tail_ns: np.ndarray  # measured work after the span end's anchor (usually the last exit), per span rank
    anchor_in_order: np.ndarray  # per row in replay order: the anchor of its issue (ISSUE/EXIT code), int8
    tail_anchor: np.ndarray  # per span rank: the anchor of its span end, int8
    start_in_order: np.ndarray  # per row in replay order: arrival after its issue, or after its queue anchor
    queue_in_order: np.ndarray  # per row in replay order: 0, or the EXIT code of the exit it queued behind, int8

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
    def _times(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        arrival, end = np.empty(len(self.rank), dtype=np.int64), np.empty(len(self.rank), dtype=np.int64)
        issue = np.empty(len(self.rank), dtype=np.int64)
        _chain_times(self.instance_ptr, self.instance_order, self.last_arrival_ns, self.span_by_instance,
                     self.rows_by_instance, self.work_in_order, self.exit_in_order, self.anchor_in_order,
                     self.start_in_order, self.queue_in_order, self.span_start_ns, issue, arrival, end)
        return arrival, end, issue

    @property
    def issue_ns(self) -> np.ndarray:
        """Each member row's aligned issue (chain order): where its work segment ends."""
        return self._times[2]

    @functools.cached_property
    def anchor_ns(self) -> np.ndarray:
        """Each member row's measured anchor (chain order): where its work segment starts."""
        return self.issue_ns - _by_row(self, self.work_in_order)

    @property
    def tail_anchor_ns(self) -> np.ndarray:
        """Each span rank's measured anchor of its span end: where its tail segment starts."""
        return self.span_end_ns - self.tail_ns

    @classmethod
    def build(cls, instance, rank, arrival_ns, end_ns, span_rank, span_start_ns, span_end_ns,
              instance_ids=None, previous_exit_only: bool = False, issue_ns=None, host_waited=None) -> "StepGraph":
        """instance: each member row's instance id - or, when the caller has numbered the instances
        itself and gives their ids as `instance_ids`, each row's index into it (no sort needed).
        previous_exit_only: anchor every arrival to its rank's previous exit (the span start for the
        first) and every span end to the last exit, whatever the times say: for a graph whose times
        are only an order (a modelled pipeline), not measurements.
        issue_ns: each row's issue (default: its arrival); host_waited: whether the rank's host was
        idle as the row's collective ended (default: true), so that its exit may release an issue."""
        # int32 ranks and instance indices (as the store returns them) stay int32: 20 million rows
        # converted to int64 and gathered cost a second per step at 10,240 ranks
        instance, rank = np.asarray(instance), np.asarray(rank)
        rank = rank if rank.dtype == np.int32 else rank.astype(np.int64)
        if len(rank) and (rank.min() < 0 or rank.max() >= 1 << 31):
            raise ValueError("ranks outside 0..2^31-1")
        arrival_ns, end_ns = np.asarray(arrival_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64)
        issue_ns = arrival_ns if issue_ns is None else np.minimum(np.asarray(issue_ns, dtype=np.int64), arrival_ns)
        host_waited = (np.ones(len(arrival_ns), dtype=np.bool_) if host_waited is None
                       else np.asarray(host_waited, dtype=np.bool_))
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
        anchor_in_order, queue_in_order = np.empty(len(rank), dtype=np.int8), np.empty(len(rank), dtype=np.int8)
        start_in_order = np.empty(len(rank), dtype=np.int64)
        tail_anchor = np.empty(len(span_rank), dtype=np.int8)
        tail_base = _measured_in_order(by_pos, ptr, instance_order, last, issue_ns, arrival_ns, end_ns, host_waited,
                                       span_by_instance, span_start, span_end, work_in_order, exit_in_order,
                                       anchor_in_order, start_in_order, queue_in_order, tail_anchor, previous_exit_only)
        return cls(g_dense.astype(idx, copy=False), g_rank.astype(np.int32, copy=False), span_rank,
                   span_start, span_end, row_span, instance_order, by_inst, ptr, span_by_instance, position, ids,
                   order, last, work_in_order, exit_in_order, span_end - tail_base, anchor_in_order, tail_anchor,
                   start_in_order, queue_in_order)

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
    none, one = np.zeros(0, dtype=np.int64), np.zeros(2, dtype=np.int64)
    exits = _replay_exits_many(g.instance_ptr, g.span_by_instance, work_in_order, exit_after_in_order, g.anchor_in_order,
                               g.start_in_order, g.queue_in_order, g.span_start_ns, g.tail_anchor, none, none, one,
                               none, none, one)[:, 0]
    ends = exits + np.asarray(tail, dtype=np.int64)
    step_ns = int(ends.max() - g.span_start_ns.min()) if len(ends) else 0
    return Replay(g.span_rank, ends, step_ns)


def replay_many(g: StepGraph, work_in_order: np.ndarray, exit_in_order: np.ndarray,
                changes: list[tuple], threads: int = 2) -> list[int]:
    """The job's step (step_ns) replayed once per change, each change (positions in replay order,
    their work there, tail per span rank[, positions in replay order, their exit after the last
    arrival there]) applied to the work (and exits): one walk over the rows for all changes (the
    rows are read once, not once per change), the changes split over `threads` threads (compiled,
    without the GIL)."""
    if not changes:
        return []
    parts = [list(range(len(changes)))[k::threads] for k in range(min(threads, len(changes)))]

    def sorted_changes(part: list[int], positions: int, values: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        at, value, counts = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)], [0]
        for i in part:
            change = changes[i]
            where = np.asarray(change[positions] if len(change) > positions else [], dtype=np.int64)
            by_position = np.argsort(where, kind="stable")
            at.append(where[by_position])
            value.append(np.asarray(change[values] if len(change) > values else [], dtype=np.int64)[by_position])
            counts.append(len(where))
        return np.concatenate(at), np.concatenate(value), np.cumsum(counts)

    def walk(part: list[int]) -> np.ndarray:
        return _replay_exits_many(g.instance_ptr, g.span_by_instance, work_in_order, exit_in_order, g.anchor_in_order,
                                  g.start_in_order, g.queue_in_order, g.span_start_ns, g.tail_anchor,
                                  *sorted_changes(part, 0, 1), *sorted_changes(part, 3, 4))

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
def _replay_exits_many(ptr, span, work, exit_after, anchor, start, queue, span_start, tail_anchor, change_at,
                       change_work, change_ptr, change_exit_at, change_exit, change_exit_ptr):  # pragma: no cover - compiled
    """Algorithm: instances in the order of their measured last arrival (a topological order: a
    member's anchors are earlier rows of its chain, and an exit follows its instance's last
    arrival); the arrays hold the member rows in that order, so the walk reads them in sequence. A
    member issues at its anchor's replayed time plus its work and arrives `start` after its issue -
    or, queued, `start` after the exit it queued behind, never before its issue; the instance's
    exits follow its latest arrival. Each span rank keeps its last ANCHOR_DEPTH issues and exits (a
    ring) for the anchors to read. Several variants of the work at once (variant t replaces the work
    at positions change_at[change_ptr[t]:change_ptr[t + 1]], ascending; one variant without changes
    is the plain replay): each span rank keeps one ring per variant, side by side, so a row is read
    once for all of them. Variant t may also replace the exit after the last arrival at positions
    change_exit_at[change_exit_ptr[t]:change_exit_ptr[t + 1]], ascending. Returns the replayed anchor
    of each span rank's end (its span start when it joined nothing), one column per variant."""
    variants = len(change_ptr) - 1
    depth = ANCHOR_DEPTH
    ring_issue = np.empty((len(span_start), variants, depth), dtype=np.int64)
    ring_exit = np.empty((len(span_start), variants, depth), dtype=np.int64)
    count = np.zeros(len(span_start), dtype=np.int64)
    cursor = change_ptr[:-1].copy()
    exit_cursor = change_exit_ptr[:-1].copy()
    latest = np.empty(variants, dtype=np.int64)
    widest = 0
    for k in range(len(ptr) - 1):
        widest = max(widest, ptr[k + 1] - ptr[k])
    issued = np.empty((widest, variants), dtype=np.int64)
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
                issue = _anchor_time(anchor[j], s, t, count, ring_issue, ring_exit, span_start) + w
                issued[j - ptr[k], t] = issue
                if queue[j] == 0:
                    arrive = issue + start[j]
                else:
                    arrive = max(issue, _anchor_time(queue[j], s, t, count, ring_issue, ring_exit, span_start) + start[j])
                if arrive > latest[t]:
                    latest[t] = arrive
        for j in range(ptr[k], ptr[k + 1]):
            s = span[j]
            slot = count[s] % depth
            for t in range(variants):
                ring_issue[s, t, slot] = issued[j - ptr[k], t]
                e = exit_after[j]
                c = exit_cursor[t]
                if c < change_exit_ptr[t + 1] and change_exit_at[c] == j:
                    e = change_exit[c]
                    exit_cursor[t] = c + 1
                ring_exit[s, t, slot] = latest[t] + e
            count[s] += 1
    out = np.empty((len(span_start), variants), dtype=np.int64)
    for s in range(len(span_start)):
        for t in range(variants):
            out[s, t] = _anchor_time(tail_anchor[s], s, t, count, ring_issue, ring_exit, span_start)
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _anchor_time(code, s, t, count, ring_issue, ring_exit, span_start):  # pragma: no cover - compiled
    """The time of anchor `code` of span rank s in variant t."""
    if code == 0:
        return span_start[s]
    slot = (count[s] - (code >> 2)) % ANCHOR_DEPTH
    return ring_exit[s, t, slot] if code & 3 == EXIT else ring_issue[s, t, slot]


@numba.njit(cache=True, nogil=True)
def _previous_exit(s, count, ring_exit, span_start):  # pragma: no cover - compiled
    """(code, time) of span rank s's previous exit, its span start before its first row."""
    if count[s] == 0:
        return 0, span_start[s]
    return 4 + EXIT, ring_exit[s, 0, (count[s] - 1) % ANCHOR_DEPTH]


@numba.njit(cache=True, nogil=True)
def _choose_anchor(x, s, count, ring_issue, ring_exit, ring_waited, span_start):  # pragma: no cover - compiled
    """(code, time) of the latest event of span rank s at or before time x among its last
    ANCHOR_DEPTH rows' issues and the exits its host waited for (an exit before an issue at the
    same time, a nearer row before a farther one); the span start for its first row. When none is
    at or before x (an issue before its previous rows' events: collectives on several streams), the
    previous exit, so that the work stays between neighbouring events and compares with its peers'."""
    if count[s] == 0:
        return 0, span_start[s]
    best_code = -1
    best_t = 0
    for back in range(1, min(count[s], ANCHOR_DEPTH) + 1):
        slot = (count[s] - back) % ANCHOR_DEPTH
        e = ring_exit[s, 0, slot]
        if ring_waited[s, slot] and e <= x and (best_code < 0 or e > best_t):
            best_code, best_t = back * 4 + EXIT, e
        i = ring_issue[s, 0, slot]
        if i <= x and (best_code < 0 or i > best_t):
            best_code, best_t = back * 4 + ISSUE, i
    if best_code < 0:
        return _previous_exit(s, count, ring_exit, span_start)
    return best_code, best_t


@numba.njit(cache=True, nogil=True)
def _queue_anchor(issue, arrival, s, count, ring_exit):  # pragma: no cover - compiled
    """(code, time) of the latest exit of span rank s's last ANCHOR_DEPTH rows that ended after
    `issue` and at or before `arrival` (the call waited for it to start), or (0, issue) when none."""
    best_code, best_t = 0, issue
    for back in range(1, min(count[s], ANCHOR_DEPTH) + 1):
        e = ring_exit[s, 0, (count[s] - back) % ANCHOR_DEPTH]
        if issue < e <= arrival and e > best_t:
            best_code, best_t = back * 4 + EXIT, e
    return best_code, best_t


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
def _measured_in_order(by_pos, ptr, instance_order, last, issue, arrival, end, waited, span, span_start, span_end,
                       work, exit_after, anchor, start, queue, tail_anchor, previous_exit_only):  # pragma: no cover - compiled
    """Walk the rows in replay order (by_pos: the caller's rows; span: each one's span index): a
    row's issue anchor is the latest earlier event of its rank that may release it (_choose_anchor
    over the rows before it in its chain, which are the rows before it in the replay) and its work
    runs from there; its arrival follows its issue or the exit it queued behind (_queue_anchor); its
    exit follows its instance's last arrival. Fills work, exit_after, anchor, start, queue and
    tail_anchor; returns each span rank's measured anchor time of its span end. The gathers from the
    caller's rows (a jump per instance) run on every core, the walk after them reads in sequence."""
    for k in numba.prange(len(ptr) - 1):
        latest = last[instance_order[k]]
        for j in range(ptr[k], ptr[k + 1]):
            i = by_pos[j]
            exit_after[j] = end[i] - latest
    depth = ANCHOR_DEPTH
    ring_issue = np.empty((len(span_start), 1, depth), dtype=np.int64)
    ring_exit = np.empty((len(span_start), 1, depth), dtype=np.int64)
    ring_waited = np.ones((len(span_start), depth), dtype=np.bool_)
    count = np.zeros(len(span_start), dtype=np.int64)
    for k in range(len(ptr) - 1):
        latest = last[instance_order[k]]
        for j in range(ptr[k], ptr[k + 1]):  # anchors from the rows before this instance
            i, s = by_pos[j], span[j]
            if previous_exit_only:
                code, t = _previous_exit(s, count, ring_exit, span_start)
                anchor[j], work[j] = code, arrival[i] - t
                queue[j], start[j] = 0, 0
                continue
            code, t = _choose_anchor(issue[i], s, count, ring_issue, ring_exit, ring_waited, span_start)
            anchor[j], work[j] = code, issue[i] - t
            code, t = _queue_anchor(issue[i], arrival[i], s, count, ring_exit)
            queue[j], start[j] = code, arrival[i] - t
        for j in range(ptr[k], ptr[k + 1]):
            i, s = by_pos[j], span[j]
            slot = count[s] % depth
            ring_issue[s, 0, slot] = arrival[i] if previous_exit_only else issue[i]
            ring_exit[s, 0, slot] = latest + exit_after[j]
            ring_waited[s, slot] = waited[i]
            count[s] += 1
    out = np.empty(len(span_start), dtype=np.int64)
    for s in range(len(span_start)):
        if previous_exit_only:
            code, t = _previous_exit(s, count, ring_exit, span_start)
        else:
            code, t = _choose_anchor(span_end[s], s, count, ring_issue, ring_exit, ring_waited, span_start)
        tail_anchor[s] = code
        out[s] = t
    return out


@numba.njit(cache=True, nogil=True)
def _chain_times(ptr, instance_order, last, span, rows, work, exit_after, anchor, start, queue, span_start,
                 issue, arrival, end):  # pragma: no cover - compiled
    """The inverse of _measured_in_order: replaying the measured work reproduces every issue,
    arrival and exit exactly; each is written at its row's place in chain order (rows: rows_by_instance)."""
    depth = ANCHOR_DEPTH
    ring_issue = np.empty((len(span_start), 1, depth), dtype=np.int64)
    ring_exit = np.empty((len(span_start), 1, depth), dtype=np.int64)
    count = np.zeros(len(span_start), dtype=np.int64)
    for k in range(len(ptr) - 1):
        latest = last[instance_order[k]]
        for j in range(ptr[k], ptr[k + 1]):
            s = span[j]
            x = _anchor_time(anchor[j], s, 0, count, ring_issue, ring_exit, span_start) + work[j]
            issue[rows[j]] = x
            if queue[j] == 0:
                arrival[rows[j]] = x + start[j]
            else:
                arrival[rows[j]] = max(x, _anchor_time(queue[j], s, 0, count, ring_issue, ring_exit, span_start) + start[j])
        for j in range(ptr[k], ptr[k + 1]):
            s = span[j]
            slot = count[s] % depth
            ring_issue[s, 0, slot] = issue[rows[j]]
            e = latest + exit_after[j]
            end[rows[j]] = e
            ring_exit[s, 0, slot] = e
            count[s] += 1
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
