"""Numbers as the report prints them: the same spelling as `bprof analyze`'s table."""

from __future__ import annotations

import math


def ms(ns) -> str:
    return "" if ns is None else f"{ns / 1e6:.2f} ms"


def pct(frac, decimals: int = 1) -> str:
    """A fraction as a percentage: `decimals` decimals from 1% up (48.7%), at least two significant
    digits below it (0.019%, 0.50%), so a small share never reads as 0.0%. Exactly zero is 0%."""
    if frac is None:
        return ""
    percent = 100 * frac
    if percent == 0:
        return "0%"
    if abs(percent) >= 1 or not math.isfinite(percent):
        return f"{percent:.{decimals}f}%"
    # two significant digits: 0.019 -> 3 decimals, 0.5 -> 2
    small = max(decimals, 1 - math.floor(math.log10(abs(percent))))
    text = f"{percent:.{small}f}"
    if abs(float(text)) >= 1:  # 0.996 rounds up to 1.00: spell it as the larger ones are
        return f"{percent:.{decimals}f}%"
    return f"{text}%"


def count(n) -> str:
    return "" if n is None else f"{n:,.0f}"


def gbps(bytes_per_s) -> str:
    return "" if bytes_per_s is None else f"{bytes_per_s / 1e9:.2f} GB/s"


def size(n_bytes) -> str:
    if n_bytes is None:
        return ""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= scale:
            return f"{n_bytes / scale:.1f} {unit}"
    return f"{n_bytes:.0f} B"


def text(value) -> str:
    return "" if value is None else str(value)
