"""Tiny hand-written Kineto traces for exact-output tests (the real ones are in ../shared)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

BASE_NS = 1790857026000000000


def modern_trace(rank: int, world_size: int = 2, steps=(2, 3), backend: str = "gloo", step_us: float = 1000.0,
                 offset_us: float = 5110314061641.296) -> dict:
    """A CPU/gloo trace like torch 2.13 writes: relative float us, baseTimeNanoseconds last."""
    events = []
    t = offset_us
    ext = 1
    for step in steps:
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 100 + rank,
                       "tid": 100 + rank, "ts": round(t, 3), "dur": step_us, "args": {"External id": ext}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100 + rank, "tid": 100 + rank,
                       "ts": round(t + 10, 3), "dur": 200.5, "args": {"External id": ext + 1,
                       "Input Dims": [[64, 64], [64, 64]], "Input type": ["float", "float"]}})
        events.append({"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 100 + rank,
                       "tid": 100 + rank, "ts": round(t + 300, 3), "dur": 40.25,
                       "args": {"External id": ext + 2, "Input Dims": [[[1000]], [], [], [], [], []],
                                "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}})
        events.append({"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 100 + rank,
                       "tid": 200 + rank, "ts": round(t + 320, 3), "dur": 300.0,
                       "args": {"External id": ext + 3, "Input Dims": [[1000]], "Input type": ["float"]}})
        t += step_us + 5
        ext += 4
    events.append({"ph": "M", "name": "thread_name", "pid": 100 + rank, "tid": 200 + rank,
                   "args": {"name": "thread 1 (pt_gloo_runloop)"}})
    return {
        "schemaVersion": 1,
        "deviceProperties": [],
        "distributedInfo": {"backend": backend, "rank": rank, "world_size": world_size, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo",
                                           "pg_size": world_size, "ranks": list(range(world_size))}]},
        "traceEvents": events,
        "traceName": "tiny",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }


def absolute_trace(rank: int, world_size: int = 2) -> dict:
    """The same shape in the pre-2024 generation: absolute integer epoch us, no base time."""
    trace = modern_trace(rank, world_size)
    shift_us = BASE_NS // 1000
    for e in trace["traceEvents"]:
        if "ts" in e:
            e["ts"] = int(round(e["ts"])) + shift_us
            if "dur" in e:
                e["dur"] = int(round(e["dur"]))
    del trace["baseTimeNanoseconds"]
    return trace


def write(path: Path, trace: dict, *, pretty: bool = False) -> Path:
    text = json.dumps(trace, indent=2 if pretty else None)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt") as f:
            f.write(text)
    else:
        path.write_text(text)
    return path
