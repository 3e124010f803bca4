"""Numbers as the report prints them: the same spelling as `bprof analyze`'s table."""

from __future__ import annotations


def ms(ns) -> str:
    return "" if ns is None else f"{ns / 1e6:.2f} ms"


def pct(frac) -> str:
    return "" if frac is None else f"{100 * frac:.1f}%"


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
