"""Who a rank's peers are, and what working like them means: the one definition that straggler
pricing (bprof.analyzers.stragglers) and the `no-stragglers` what-if scenario share.

Ranks are peers when they play the same role in the step (same pipeline stage, same count of each
collective kind); a member row's work is compared with the rows of its peers that come before the
same occurrence of the same collective kind. PeerStep prices sets of ranks against the others
(the straggler findings' lost_ns) and gives their work as the median of their peers' (the
`no-stragglers` scenario).
"""

from __future__ import annotations

import functools
import statistics

import numba
import numpy as np

from bprof.whatif.engine import (StepGraph, _counting_sort, exit_offsets, replay_in_order, replay_many, replay_positions,
                                 work_segments)

# Collectives after which every member has the result once the last one arrived (as clock.sql's exits).
SYMMETRIC_OPS = ("all_reduce", "all_gather", "reduce_scatter", "barrier")


class PeerStep:
    """One step's graph and what pricing a set of ranks needs, computed once: each member row's key
    (the rank's role signature, the row's role, and which occurrence of that role on the rank it
    is), the rows sorted by key and work, and each row's position there.

    Ranks share a role signature when they sit at the same pipeline stage (bubbles_stages; middle
    stages of 1F1B join the same collectives in another order) and join the same collectives in a
    step (the same count of each op and group size: one layer of the parallel layout). The
    work before a rank's j-th collective of a kind is compared with the work before the j-th of that
    kind on the ranks of its signature (chain order can differ between ranks when several
    collectives are in flight), and the tail after the last one with their tails."""

    def __init__(self, g: StepGraph, role: np.ndarray, stage: np.ndarray, priced: set[int],
                 symmetric: np.ndarray | None = None):
        self.g = g
        self.symmetric = symmetric  # per dense instance: a symmetric collective (SYMMETRIC_OPS)
        work, _ = work_segments(g)  # by rank (chain order): the peers' work is compared there
        self.work_in_order, self.exit_in_order, self.tail = g.work_in_order, g.exit_in_order, g.tail_ns
        idx = g.rows_by_instance.dtype  # int32 below 2^31 rows (20 million per step at 10,240 ranks)
        # the unchanged replay reproduces every measured time (the chains follow the replay order)
        self.step_ns = int(g.span_end_ns.max() - g.span_start_ns.min()) if len(g.span_rank) else 0
        # signature: per rank, its pipeline stage and the count of each role
        self.sig, roles = signatures(g, role, stage)
        # Only the rows of ranks that share a signature with a priced rank are ever compared: sort those.
        wanted = np.isin(self.sig, self.sig[np.isin(g.span_rank, list(priced))])
        self.rows = np.flatnonzero(wanted[g.row_span]).astype(idx)  # ascending: by rank, then chain order
        m = len(self.rows)
        sub_role, sub_span, sub_work = role[self.rows], g.row_span[self.rows], work[self.rows]
        del work
        occurrence = _occurrence(sub_span, sub_role, roles)
        occurrences = int(occurrence.max()) + 1 if m else 1
        group = (self.sig[sub_span] * roles + sub_role) * occurrences + occurrence
        del sub_role, sub_span, occurrence
        num_keys = int(group.max()) + 1 if m else 0
        if num_keys <= max(m, 1 << 20):
            # a counting sort by key, then each key's rows (one per rank of the signature) by work:
            # small sorts in cache instead of one argsort of 20 million keys
            order, ptr = _by_key_then_work(group, sub_work, num_keys)
            self.group_first = ptr[group].astype(idx)  # sorted position of the row's key's first row
            self.group_size = (ptr[group + 1] - ptr[group]).astype(idx)
            del group, ptr
        else:
            order = _by_group_and_work(group, sub_work)
            sorted_group = group[order]
            del group
            group_start = np.flatnonzero(np.r_[True, sorted_group[1:] != sorted_group[:-1]])
            del sorted_group
            sizes = np.diff(np.r_[group_start, m])
            self.group_first = np.empty(m, dtype=idx)
            self.group_first[order] = np.repeat(group_start, sizes)
            self.group_size = np.empty(m, dtype=idx)
            self.group_size[order] = np.repeat(sizes, sizes)
        self.sorted_work = sub_work[order]
        del sub_work
        self.position = np.empty(m, dtype=idx)  # sorted position of the row
        self.position[order] = np.arange(m, dtype=idx)
        # rows are sorted by rank: span rank i has rows rank_start[i]:rank_start[i + 1]
        self.rank_start = np.searchsorted(g.row_span, np.arange(len(g.span_rank) + 1, dtype=g.row_span.dtype))

    def gain(self, ranks: set[int]) -> int:
        """How much shorter the step is when `ranks` work like the median of the other ranks of their
        signature (a rank whose signature nobody else has keeps its own work). `ranks` must be among
        the ranks the step was built to price."""
        return self.gains([ranks], threads=1)[0]

    def gains(self, rank_sets: list[set[int]], threads: int = 2) -> list[int]:
        """gain() of each set of ranks: the replays of all sets in one walk over the step's rows
        (engine.replay_many), on `threads` threads."""
        changes = [self._like_peers(r) if np.isin(self.g.span_rank, list(r)).any() else None for r in rank_sets]
        todo = [i for i, c in enumerate(changes) if c is not None]
        steps = replay_many(self.g, self.work_in_order, self.exit_in_order, [changes[i] for i in todo], threads)
        out = [0] * len(rank_sets)
        for i, step_ns in zip(todo, steps):
            out[i] = self.step_ns - step_ns
        return out

    def like_peers(self, ranks: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(work in replay order, tail per span rank, exit after the last arrival in replay order)
        with `ranks` working like the median of the other ranks of their signature."""
        at, work, new_tail, exit_at, exits = self._like_peers(ranks)
        work_in_order = self.work_in_order.copy()
        work_in_order[at] = work
        exit_in_order = self.exit_in_order.copy()
        exit_in_order[exit_at] = exits
        return work_in_order, new_tail, exit_in_order

    def _like_peers(self, ranks: set[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """like_peers() as the positions in replay order whose work changes, their new work, the
        tail per span rank, and the positions in replay order whose exit changes with their exits.

        Working like its peers, a rank also leaves a symmetric collective (all-reduce, all-gather,
        reduce-scatter, barrier: every member has the result once the last one arrived) no later
        than the instance's first member leaves it: a later exit of its own is its host slow to
        resume - on CPU ranks, its gloo thread closing the collective while the rank's own extra
        work holds the cores - which working like its peers removes (measured, tests/programs:
        a DDP straggler's last buckets closed 8-16 ms after its peer's)."""
        g = self.g
        chosen = np.isin(g.span_rank, list(ranks))
        spans = np.flatnonzero(chosen)
        rows = (np.concatenate([np.arange(self.rank_start[i], self.rank_start[i + 1]) for i in spans.tolist()])
                if len(spans) else np.zeros(0, dtype=np.int64))
        new_tail = self.tail.copy()
        exit_at, exits = self._first_exits(rows)
        if not len(rows):
            return rows, self.work_in_order[rows], new_tail, exit_at, exits
        sub = np.minimum(np.searchsorted(self.rows, rows), max(len(self.rows) - 1, 0))  # rows -> index in self.rows
        if not len(self.rows) or (self.rows[sub] != rows).any():
            raise ValueError(f"ranks {sorted(ranks)} were not among the ranks this step was built to price")
        # Per chosen row, the median of its key's rows without the chosen ranks' rows: walk the
        # sorted key from its first row, skipping the chosen rows' positions (ascending).
        excluded = np.sort(self.position[sub])
        left = self.group_size[sub] - self._excluded_in_group(sub, excluded)
        keep = left > 0
        rows, sub, left = rows[keep], sub[keep], left[keep]
        lo = self._nth_unexcluded(sub, (left - 1) // 2, excluded)
        hi = self._nth_unexcluded(sub, left // 2, excluded)
        work = ((self.sorted_work[lo] + self.sorted_work[hi]) / 2).astype(np.int64)
        for sig in np.unique(self.sig[chosen]).tolist():
            peers = (self.sig == sig) & ~chosen
            if peers.any():
                new_tail[(self.sig == sig) & chosen] = int(statistics.median(self.tail[peers].tolist()))
        return replay_positions(self.g, rows), work, new_tail, exit_at, exits

    def _first_exits(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Of `rows` (chain order), those in symmetric instances that leave later than the
        instance's first member: their positions in replay order and that first exit."""
        empty = np.zeros(0, dtype=np.int64)
        if self.symmetric is None or not len(rows):
            return empty, empty
        g = self.g
        exits = self._row_exits
        first = np.full(len(g.instance_ids), np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, g.instance, exits)
        inst = g.instance[rows]
        later = self.symmetric[inst] & (exits[rows] > first[inst])
        return replay_positions(g, rows[later]), first[inst[later]]

    @functools.cached_property
    def _row_exits(self) -> np.ndarray:
        """Each member row's measured exit after its instance's last arrival (chain order)."""
        return exit_offsets(self.g)

    @functools.cached_property
    def order_position(self) -> np.ndarray:
        """Each row's place in replay order (work_in_order[order_position] is the work by row)."""
        position = np.empty(len(self.g.rank), dtype=self.g.rows_by_instance.dtype)
        position[self.g.rows_by_instance] = np.arange(len(position), dtype=position.dtype)
        return position

    def link_gain(self, slowed_instances: np.ndarray, ratio: float) -> int:
        """How much shorter the step is when the transfers of `slowed_instances` take 1/ratio as long."""
        g = self.g
        exits = self.exit_in_order.copy()
        touched = np.isin(g.instance_ids, slowed_instances)[g.instance[g.rows_by_instance]]
        exits[touched] = (exits[touched] / ratio).astype(np.int64)
        return self.step_ns - replay_in_order(g, self.work_in_order, exits, self.tail).step_ns

    def _excluded_in_group(self, rows: np.ndarray, excluded: np.ndarray) -> np.ndarray:
        first = self.group_first[rows]
        return np.searchsorted(excluded, first + self.group_size[rows]) - np.searchsorted(excluded, first)

    def _nth_unexcluded(self, rows: np.ndarray, nth: np.ndarray, excluded: np.ndarray) -> np.ndarray:
        """Sorted position of the nth row of each row's key that is not excluded: start at first + nth
        and step past every excluded position at or before it (few: the chosen ranks' rows)."""
        pos = self.group_first[rows] + nth
        skipped = np.searchsorted(excluded, self.group_first[rows])  # excluded positions before the key
        while True:
            behind = np.searchsorted(excluded, pos, side="right") - skipped  # excluded in [first, pos]
            target = self.group_first[rows] + nth + behind
            if np.array_equal(target, pos):
                return pos
            pos = target


def signatures(g: StepGraph, role: np.ndarray, stage: np.ndarray) -> tuple[np.ndarray, int]:
    """Per span rank, its role signature id (pipeline stage and the count of each role); and the
    number of roles."""
    roles = int(role.max()) + 1 if len(role) else 1
    counts = _role_counts(g.row_span, role, len(g.span_rank), roles)
    if not len(counts):
        return np.zeros(0, dtype=np.int64), roles
    # ids numbered in order of first appearance (as a dict of the distinct rows would)
    _, first, inverse = np.unique(np.column_stack([stage, counts]), axis=0, return_index=True, return_inverse=True)
    renumber = np.empty(len(first), dtype=np.int64)
    renumber[np.argsort(first)] = np.arange(len(first))
    return renumber[inverse.reshape(-1)], roles


@numba.njit(cache=True, nogil=True)
def _role_counts(span, role, num_spans, roles):  # pragma: no cover - compiled
    """How many rows of each role each span rank has (num_spans x roles)."""
    counts = np.zeros((num_spans, roles), dtype=np.int64)
    for i in range(len(span)):
        counts[span[i], role[i]] += 1
    return counts


@numba.njit(cache=True, nogil=True)
def _occurrence(span, role, roles):  # pragma: no cover - compiled
    """For rows sorted by rank (span index) and chain order: which occurrence of its role on its
    rank each row is (0, 1, ...)."""
    out = np.empty(len(span), dtype=np.int64)
    seen = np.zeros(roles, dtype=np.int64)
    for i in range(len(span)):
        if i == 0 or span[i] != span[i - 1]:
            seen[:] = 0
        out[i] = seen[role[i]]
        seen[role[i]] += 1
    return out


@numba.njit(cache=True, nogil=True, parallel=True)
def _by_key_then_work(key, work, num_keys):  # pragma: no cover - compiled
    """Rows by key 0..num_keys-1 (counting sort), each key's rows by work (the keys on every core);
    and each key's start (CSR). Rows of equal key and work are interchangeable here, so the sort
    within a key need not be stable."""
    rows, ptr = _counting_sort(key, num_keys)
    for k in numba.prange(num_keys):
        lo, hi = ptr[k], ptr[k + 1]
        if hi - lo > 1:
            chunk = rows[lo:hi].copy()
            rows[lo:hi] = chunk[np.argsort(work[chunk])]
    return rows, ptr


def _by_group_and_work(group: np.ndarray, work: np.ndarray) -> np.ndarray:
    """Rows by (group, work): one argsort of a packed key when work spans under 2^40 ns and groups
    number under 2^23, else a lexsort (rows of equal group and work are interchangeable here)."""
    if not len(group):
        return np.zeros(0, dtype=np.int64)
    rel = work - work.min()
    if rel.max() < 1 << 40 and group.max() < 1 << 23:
        return np.argsort((group << 40) | rel)
    return np.lexsort((work, group))
