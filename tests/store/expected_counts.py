"""Independent expectations for a Kineto trace, computed with the stdlib only.

Deliberately shares no code with bprof's ingest (which is SQL over DuckDB): it walks the raw
JSON in Python with simpler rules, so agreement between the two is evidence, not tautology.
"""

from __future__ import annotations

import gzip
import json
import math
import re
from collections import Counter
from pathlib import Path

CPU_CATS = {"cpu_op", "Operator", "user_annotation"}
KERNEL_CATS = {"kernel", "Kernel"}
# a launch: a runtime call, or a driver call (NCCL >= 2.27 and Triton launch through cuLaunchKernel*)
LAUNCH_CATS = {"cuda_runtime", "Runtime", "cuda_driver"}


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def op_of(name: str) -> str:
    key = re.sub(r"^(c10d::|_c10d_functional::|nccl:|gloo:|nccl(dev)?kernel_)", "", name.lower()).replace("_", "")
    for prefix, op in (("allreduce", "all_reduce"), ("allgather", "all_gather"), ("reducescatter", "reduce_scatter"),
                       ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("barrier", "barrier"),
                       ("sendrecv", "send_recv"), ("send", "send"), ("recv", "recv")):
        if key.startswith(prefix):
            return op
    return "unknown"


def first_input_elems(args: dict) -> int | None:
    """Elements of a CPU op's first input from Input Dims/Input type; None when the trace does not
    say (a TensorList recorded without its tensors' dims, or no shapes at all)."""
    dims, types = args.get("Input Dims") or [], args.get("Input type") or []
    if not dims or not isinstance(dims[0], list):
        return None
    first, kind = dims[0], (types[0] if types else None)
    if kind in ("TensorList", "GenericList") or (first and isinstance(first[0], list)):
        return sum(math.prod(d) for d in first) if first else None
    if not first and kind in (None, "", "Scalar"):
        return None
    return math.prod(first)  # a 0-d tensor (dims []) holds one element


def expected(path: Path) -> dict:
    trace = load(path)
    events = trace["traceEvents"]
    dist = trace.get("distributedInfo") or {}
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in KERNEL_CATS]
    devices = Counter(e["args"].get("device", e.get("pid")) for e in kernels)
    device_name = "cpu"
    if devices:
        index = devices.most_common(1)[0][0]
        # None where the trace lists no properties for that device (sampled traces drop them)
        device_name = next((p["name"] for p in trace.get("deviceProperties") or [] if p["id"] == index), None)
    steps = {e["name"] for e in events if e.get("cat") in CPU_CATS and str(e.get("name", "")).startswith("ProfilerStep#")}

    c10d = [e for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::") and "wait" not in e["name"]]
    calls = Counter(op_of(e["name"]) for e in c10d)

    def within(e, c):
        return c["tid"] == e["tid"] and c["ts"] <= e["ts"] and e["ts"] + e.get("dur", 0) <= c["ts"] + c["dur"]

    # traces of 2022 and before trace no c10d op around torch's nccl:<op> range (the record_function
    # in ProcessGroupNCCL): that range is the call, and names its op and input
    nccl_ranges = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "user_annotation")
                   and str(e.get("name", "")).startswith("nccl:") and not any(within(e, c) for c in c10d)]
    calls.update(op_of(e["name"]) for e in nccl_ranges)
    owners = c10d + nccl_ranges
    # NCCL kernels whose launch is not inside any c10d call (or bare nccl: range) of the same thread: kernel-only rows
    launches = {}
    for e in sorted((e for e in events if e.get("cat") in LAUNCH_CATS and "correlation" in e.get("args", {})),
                    key=lambda e: -e["ts"]):
        launches[e["args"]["correlation"]] = e  # the earliest call of a correlation id
    for k in kernels:
        if not k["name"].lower().startswith("nccl"):
            continue
        launch = launches.get(k["args"].get("correlation"))
        inside = launch is not None and any(
            c["tid"] == launch["tid"] and c["ts"] <= launch["ts"] <= c["ts"] + c["dur"] for c in owners)
        if not inside:
            calls[op_of(k["name"])] += 1
    if not c10d:  # CPU-only traces without c10d ops: the gloo worker ranges are the calls
        for e in events:
            if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:"):
                calls[op_of(e["name"])] += 1
    # a kernel's step: its launch's, when the launch lies in a step; else the step holding its start
    ranges = {}
    for e in events:
        if e.get("cat") in CPU_CATS and str(e.get("name", "")).startswith("ProfilerStep#"):
            lo, hi = ranges.get(e["name"], (e["ts"], e["ts"] + e["dur"]))
            ranges[e["name"]] = (min(lo, e["ts"]), max(hi, e["ts"] + e["dur"]))

    def step_at(ts):
        return next((int(name[13:]) for name, (lo, hi) in ranges.items() if lo <= ts < hi), None)

    kernel_steps = Counter()
    for k in kernels:
        launch = launches.get(k["args"].get("correlation"))
        launch_step = step_at(launch["ts"]) if launch is not None else None
        kernel_steps[launch_step if launch_step is not None else step_at(k["ts"])] += 1
    # input elements of each c10d call: its first nested record_param_comms' In msg nelems, else its shapes
    rpcs = [e for e in events if e.get("name") == "record_param_comms" and e.get("ph") == "X"]
    c10d_elems = Counter()
    for c in c10d:
        inner = sorted((r for r in rpcs if r["tid"] == c["tid"] and c["ts"] <= r["ts"]
                        and r["ts"] + r["dur"] <= c["ts"] + c["dur"]), key=lambda r: r["ts"])
        nelems = (inner[0].get("args") or {}).get("In msg nelems") if inner else None
        c10d_elems[(op_of(c["name"]), nelems if nelems is not None else first_input_elems(c.get("args") or {}))] += 1
    range_elems = Counter((op_of(e["name"]), first_input_elems(e.get("args") or {})) for e in nccl_ranges)
    # send/recv messages by (sender, receiver), from the peer torch writes on each side
    p2p = Counter()
    for r in rpcs:
        a = r.get("args") or {}
        peer = a.get("Dst Rank") if a.get("Collective name") == "send" else a.get("Src Rank")
        if a.get("Collective name") in ("send", "recv") and peer is not None:
            me = dist.get("rank")
            p2p[(a["Collective name"], me, peer) if a["Collective name"] == "send" else ("recv", peer, me)] += 1
    waits = sum(1 for e in events if e.get("name") == "record_param_comms"
                and (e.get("args") or {}).get("Collective name") == "wait")
    return {
        "rank": dist.get("rank"),
        "world_size": dist.get("world_size"),
        "device_name": device_name,
        "num_events": len(events),
        "num_steps": len(steps),
        "num_kernels": len(kernels),
        "collectives": dict(calls),
        "num_wait_records": waits,
        "kernel_steps": dict(kernel_steps),
        "c10d_elems": dict(c10d_elems),
        "nccl_range_elems": dict(range_elems),  # (op, input elements) of the bare nccl:<op> range calls
        "p2p_messages": dict(p2p),  # (send | recv, sender, receiver) -> calls
    }


# ---- device time, from the raw JSON (exact ns), for the corpus of real traces (tests/real) ----

DEVICE_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy", "Memcpy": "memcpy",
               "gpu_memset": "memset", "Memset": "memset"}


def load_exact(path: Path) -> dict:
    """The trace with every number that has a fraction kept as a Decimal (no float rounding)."""
    from decimal import Decimal

    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f, parse_float=Decimal)


def to_ns(us) -> int:
    """Microseconds as written (int or Decimal) to integer ns, keeping 3 decimals as DuckDB's
    DECIMAL(22,3) does (half away from zero)."""
    from decimal import ROUND_HALF_UP, Decimal

    return int((Decimal(us) * 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def device_intervals(trace: dict) -> dict[str, list[tuple[int, int]]]:
    """[start_ns, end_ns) of every kernel, memcpy and memset, by kind, on the epoch scale."""
    base = int(trace.get("baseTimeNanoseconds") or 0)
    out: dict[str, list[tuple[int, int]]] = {"kernel": [], "memcpy": [], "memset": []}
    for e in trace["traceEvents"]:
        kind = DEVICE_CATS.get(e.get("cat"))
        if kind is None or e.get("ph") != "X":
            continue
        start = base + to_ns(e["ts"])
        out[kind].append((start, start + to_ns(e.get("dur", 0))))
    return out


def union_ns(intervals, lo: int | None = None, hi: int | None = None) -> int:
    """Length of the union of [start, end) intervals, clipped to [lo, hi) when given."""
    total, reach = 0, None
    for start, end in sorted(intervals):
        if lo is not None:
            start = max(start, lo)
        if hi is not None:
            end = min(end, hi)
        if end <= start:
            continue
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def busy_ns(trace: dict, lo: int | None = None, hi: int | None = None) -> int:
    """Device busy time: the union of kernel, memcpy and memset intervals on every stream."""
    return union_ns([iv for ivs in device_intervals(trace).values() for iv in ivs], lo, hi)


COMM_KERNEL = re.compile(r"^(void )?(nccl|rccl)", re.IGNORECASE)


def device_counts(trace: dict) -> dict:
    """Device events by kind, NCCL/RCCL-named kernels, and the device span (first start, last end)."""
    ivs = device_intervals(trace)
    every = [iv for kind in ivs.values() for iv in kind]
    names = [e["name"] for e in trace["traceEvents"]
             if DEVICE_CATS.get(e.get("cat")) == "kernel" and e.get("ph") == "X"]
    return {
        "kernels": len(ivs["kernel"]),
        "memcpy": len(ivs["memcpy"]),
        "memset": len(ivs["memset"]),
        "comm_kernels": sum(1 for n in names if COMM_KERNEL.match(n)),
        "first_ns": min((s for s, _ in every), default=None),
        "last_ns": max((e for _, e in every), default=None),
        "busy_ns": union_ns(every),
    }
