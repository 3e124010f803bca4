"""How much of one set of intervals lies inside another, per key, in numpy: the union of A (its
intervals may overlap each other) intersected with B (disjoint), summed per key.

SQL does this with a window per key (iv_union) and an interval join; at 10,240 ranks A and B hold
tens of millions of rows each and that costs minutes. Here it is two sorts and prefix sums.
"""

from __future__ import annotations

import numpy as np

_KEY_SHIFT = 41  # times relative to their key's base stay below 2^41 ns (36 minutes)


def union_overlap_ns(num_keys: int, base_ns: np.ndarray,
                     a_key: np.ndarray, a_start: np.ndarray, a_end: np.ndarray,
                     b_key: np.ndarray, b_start: np.ndarray, b_end: np.ndarray) -> np.ndarray:
    """Per key 0..num_keys-1: |union(A_key) ∩ B_key| in ns. B's intervals of one key must not
    overlap each other (segments of a partition); A's may. base_ns[key] is a time at or before
    every interval of the key, and each interval ends within 2^41 ns of it.

    Algorithm: every time becomes key << 41 | (time - base), so one sorted order holds all keys
    apart. A's union: sorted by start, an interval opens a new island when it starts after the
    running maximum end before it (touching intervals merge). B's coverage below t is a prefix sum
    over B sorted by start, read with a binary search, so an island [s, e) covers
    coverage(e) - coverage(s) of B."""
    out = np.zeros(num_keys, dtype=np.int64)
    a_keep, b_keep = a_end > a_start, b_end > b_start
    if not a_keep.any() or not b_keep.any():
        return out
    a_s, a_e = _flat(a_key[a_keep], a_start[a_keep], a_end[a_keep], base_ns)
    b_s, b_e = _flat(b_key[b_keep], b_start[b_keep], b_end[b_keep], base_ns)
    order = np.argsort(a_s, kind="stable")
    a_s, a_e = a_s[order], a_e[order]
    running = np.maximum.accumulate(a_e)
    opens = np.ones(len(a_s), dtype=bool)
    opens[1:] = a_s[1:] > running[:-1]
    first = np.flatnonzero(opens)
    island_start = a_s[first]
    island_end = np.maximum.reduceat(a_e, first)
    order = np.argsort(b_s, kind="stable")
    b_s, b_e = b_s[order], b_e[order]
    prefix = np.zeros(len(b_s) + 1, dtype=np.int64)
    np.cumsum(b_e - b_s, out=prefix[1:])
    covered = _coverage(island_end, b_s, b_e, prefix) - _coverage(island_start, b_s, b_e, prefix)
    np.add.at(out, island_start >> _KEY_SHIFT, covered)
    return out


def _flat(key, start, end, base_ns):
    rel_start = start - base_ns[key]
    rel_end = end - base_ns[key]
    if len(rel_start) and (rel_start.min() < 0 or rel_end.max() >= 1 << _KEY_SHIFT):
        raise ValueError("an interval starts before its key's base or ends 2^41 ns after it")
    shifted = key.astype(np.int64) << _KEY_SHIFT
    return shifted | rel_start, shifted | rel_end


def _coverage(t: np.ndarray, b_s: np.ndarray, b_e: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    """Total length of B below each t."""
    i = np.searchsorted(b_s, t, side="right")  # B intervals starting at or before t
    last = np.maximum(i - 1, 0)
    partial = np.where(i > 0, np.minimum(t, b_e[last]) - b_s[last], 0)
    return prefix[np.maximum(i - 1, 0)] * (i > 0) + np.maximum(partial, 0)
