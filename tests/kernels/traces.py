"""Distinct event names of a Kineto trace file, read with gzip + json (no store, no duckdb)."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path

# Kineto category -> store events.kind (old traces say Kernel/Memcpy/Memset/Operator)
KIND_OF_CAT = {
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "gpu_memcpy", "Memcpy": "gpu_memcpy",
    "gpu_memset": "gpu_memset", "Memset": "gpu_memset",
    "cpu_op": "cpu_op", "Operator": "cpu_op",
    "user_annotation": "user_annotation",
}


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


@functools.cache
def distinct_names(path: Path) -> frozenset[tuple[str, str]]:
    """(name, kind) of every complete event whose category has a store kind above (cached per file)."""
    trace = load_trace(path)
    return frozenset((e["name"], KIND_OF_CAT[e["cat"]]) for e in trace.get("traceEvents", [])
                     if e.get("ph") == "X" and e.get("cat") in KIND_OF_CAT)


def cpu_op_events(path: Path, names: set[str]) -> list[dict]:
    """The cpu_op events named in names, with their args."""
    trace = load_trace(path)
    return [e for e in trace.get("traceEvents", [])
            if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Operator") and e.get("name") in names]


ROOT = Path(__file__).resolve().parents[2]
SHARED_TRACES = ROOT.parent / "shared" / "traces"


def shared_trace(name: str) -> Path:
    """A folder of ../shared/traces; skips the test when it is absent (it exists in dev checkouts only)."""
    import pytest

    path = SHARED_TRACES / name
    if not path.is_dir():
        pytest.skip(f"real trace fixtures not available: {path} is missing")
    return path
