"""Kernel and op names to a fine class and an HTA-style coarse class, by the rules in catalogue.csv.

The first catalogue row (file order) whose pattern matches wins; a name no row matches is
`unknown` and stays so (never guessed). Coarse classes follow HTA: any kernel that is not
communication, memory or sync counts as compute, unknown included.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

FINE_CLASSES: tuple[str, ...] = (
    "gemm", "attention", "norm", "elementwise", "reduction", "optimizer", "embedding", "quantize",
    "communication", "memcpy", "memset", "sync", "unknown",
)
COARSE_OF: dict[str, str] = {
    **{fine: "compute" for fine in FINE_CLASSES},
    "communication": "comm",
    "memcpy": "memory",
    "memset": "memory",
    "sync": "sync",
}
APPLIES_TO: tuple[str, ...] = ("kernel", "cpu_op", "memcpy", "memset", "any")

# Store events.kind -> the catalogue's applies_to rows it may match (besides 'any').
# CPU-side annotations (nccl:all_reduce, gloo:all_reduce) are named like CPU ops.
_SCOPE_OF_KIND = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "cpu_op": "cpu_op",
    "user_annotation": "cpu_op",
    "gpu_user_annotation": "cpu_op",
}

_GRAPH_LAUNCH = re.compile(r"^(cuda|hip)GraphLaunch(_v\d+)?$|^cuGraphLaunch(_ptsz)?$")


@dataclass(frozen=True)
class Classification:
    fine_class: str
    coarse_class: str
    rule_id: str | None  # None when unknown


@dataclass(frozen=True)
class Rule:
    rule_id: str
    applies_to: str
    pattern: re.Pattern[str]
    fine_class: str
    source: str
    example: str


UNKNOWN = Classification("unknown", COARSE_OF["unknown"], None)


@functools.cache
def rules() -> tuple[Rule, ...]:
    """The catalogue rows in priority order, regexes compiled once."""
    text = resources.files("bprof.kernels").joinpath("catalogue.csv").read_text(encoding="utf-8")
    out = []
    for row in csv.DictReader(io.StringIO(text)):
        if row["applies_to"] not in APPLIES_TO:
            raise ValueError(f"catalogue.csv {row['rule_id']}: applies_to {row['applies_to']!r}")
        if row["fine_class"] not in FINE_CLASSES or row["fine_class"] == "unknown":
            raise ValueError(f"catalogue.csv {row['rule_id']}: fine_class {row['fine_class']!r}")
        out.append(Rule(row["rule_id"], row["applies_to"], re.compile(row["pattern"]),
                        row["fine_class"], row["source"], row["example"]))
    ids = [r.rule_id for r in out]
    if len(set(ids)) != len(ids):
        raise ValueError("catalogue.csv: duplicate rule_id")
    return tuple(out)


@functools.cache
def _rules_for(scope: str | None) -> tuple[Rule, ...]:
    return tuple(r for r in rules() if r.applies_to == "any" or r.applies_to == scope)


@functools.lru_cache(maxsize=1 << 16)
def classify(name: str, kind: str) -> Classification:
    """Class of one event name; kind is a store events.kind ('kernel', 'gpu_memcpy', 'cpu_op', ...)."""
    for rule in _rules_for(_SCOPE_OF_KIND.get(kind)):
        if rule.pattern.search(name):
            return Classification(rule.fine_class, COARSE_OF[rule.fine_class], rule.rule_id)
    return UNKNOWN


def classify_many(rows: Iterable[tuple[str, str]]) -> list[tuple[str, str, str, str, str | None]]:
    """(name, kind, fine, coarse, rule_id) per (name, kind): rows for a join table over DISTINCT names."""
    out = []
    for name, kind in rows:
        c = classify(name, kind)
        out.append((name, kind, c.fine_class, c.coarse_class, c.rule_id))
    return out


def is_graph_launch(name: str) -> bool:
    """True for the runtime/driver call that replays a CUDA/HIP graph (its kernels share its correlation)."""
    return _GRAPH_LAUNCH.match(name) is not None
