"""Host clocks and deterministic noise.

A rank writes `written_ns = true_ns + host offset + wander(true_ns)`. The wander is a slow sine of
amplitude `clock_jitter_ns` (each host its own phase and period), so every event gets a different
error of at most `clock_jitter_ns`, yet `t + wander(t)` stays strictly increasing: nesting,
stream order and flow endpoints written by one rank stay exactly as consistent as in a real
Kineto trace, while cross-rank alignment is off by the offset plus up to twice the jitter.
"""

from __future__ import annotations

import math

_MASK = (1 << 64) - 1


def mix(*xs: int) -> int:
    """A deterministic 64-bit hash of integers (splitmix64 chain); Python's hash() is salted."""
    h = 0x243F6A8885A308D3
    for x in xs:
        h = (h ^ (x & _MASK)) + 0x9E3779B97F4A7C15 & _MASK
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
        h = (h ^ (h >> 27)) * 0x94D049BB133111EB & _MASK
        h ^= h >> 31
    return h


def jitter(amplitude: int, *key: int) -> int:
    """A deterministic integer in [-amplitude, amplitude] for `key`."""
    if amplitude <= 0:
        return 0
    return mix(*key) % (2 * amplitude + 1) - amplitude


class HostClock:
    """The clock of one host: a fixed offset plus a bounded, slow, monotone-preserving wander."""

    def __init__(self, seed: int, host: int, offset_ns: int, jitter_ns: int, ref_ns: int):
        self.offset_ns = offset_ns
        self.jitter_ns = jitter_ns
        self.ref_ns = ref_ns
        # Slope of the wander is 2*pi*J/P <= 0.25 < 1, so t + wander(t) never goes backwards.
        self.period_ns = max(40_000_000 + 7_000_000 * host, 26 * jitter_ns)
        self.phase = 2 * math.pi * (mix(seed, host, 0xC10C) % 10_000) / 10_000
        self._scale = 2 * math.pi / self.period_ns

    def wander(self, true_ns: int) -> int:
        return self.written(true_ns) - true_ns - self.offset_ns

    def written(self, true_ns: int) -> int:
        """Absolute epoch ns this host's clock reads at true time `true_ns`."""
        if not self.jitter_ns:
            return true_ns + self.offset_ns
        x = self._scale * (true_ns - self.ref_ns) + self.phase
        return true_ns + self.offset_ns + round(self.jitter_ns * math.sin(x))
