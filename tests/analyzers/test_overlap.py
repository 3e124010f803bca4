"""overlap.union_overlap_ns against a brute-force count, nanosecond by nanosecond."""

import numpy as np
import pytest

from bprof.analyzers.overlap import union_overlap_ns


def _brute(num_keys, base, a, b):
    out = [0] * num_keys
    for k in range(num_keys):
        covered_a = set()
        for key, s, e in a:
            if key == k:
                covered_a.update(range(s, e))
        covered_b = set()
        for key, s, e in b:
            if key == k:
                covered_b.update(range(s, e))
        out[k] = len(covered_a & covered_b)
    return out


def _disjoint(rng, key, base, n):
    cuts = np.sort(rng.choice(np.arange(base, base + 400), size=2 * n, replace=False))
    return [(key, int(s), int(e)) for s, e in zip(cuts[0::2], cuts[1::2])]


@pytest.mark.parametrize("seed", range(20))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    num_keys = 4
    base = np.array([1_000, 5_000, 9_000, 20_000], dtype=np.int64)
    a = []
    for _ in range(int(rng.integers(0, 30))):  # overlapping, touching, empty and zero-length intervals
        k = int(rng.integers(0, num_keys))
        s = int(base[k] + rng.integers(0, 380))
        a.append((k, s, s + int(rng.integers(0, 40))))
    b = [iv for k in range(num_keys) for iv in _disjoint(rng, k, int(base[k]), int(rng.integers(0, 8)))]
    arr = lambda rows, i: np.array([r[i] for r in rows], dtype=np.int64)  # noqa: E731
    got = union_overlap_ns(num_keys, base, arr(a, 0), arr(a, 1), arr(a, 2), arr(b, 0), arr(b, 1), arr(b, 2))
    assert got.tolist() == _brute(num_keys, base, a, b)


def test_interval_before_its_base_is_refused():
    with pytest.raises(ValueError):
        one = np.array([0], dtype=np.int64)
        union_overlap_ns(1, np.array([100], dtype=np.int64), one, np.array([50]), np.array([150]), one,
                         np.array([100]), np.array([120]))
