"""Read synthetic traces back with the standard library only (gzip + json), independently of
bprof.synth's own bookkeeping."""

from __future__ import annotations

import gzip
import json
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from pathlib import Path

# host_name is the synth's stand-in for the host `bprof record` stores (not a Kineto key).
MODERN_KEYS = ["schemaVersion", "deviceProperties", "distributedInfo", "host_name", "traceEvents",
               "traceName", "displayTimeUnit", "baseTimeNanoseconds"]
KEYS_2022 = ["schemaVersion", "deviceProperties", "distributedInfo", "host_name", "traceEvents"]
TRIMONTH_NS = 7_889_238 * 10**9
C10D = {"c10d::allreduce_": "allreduce", "c10d::_allgather_base_": "allgather",
        "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::broadcast_": "broadcast",
        "c10d::send": "send", "c10d::recv_": "recv"}
COLL_ARGS = {"Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype",
             "In split size", "Out split size", "Process Group Name",
             "Process Group Description", "Process Group Ranks", "Global rank start",
             "Global rank stride", "Seq", "Rank"}
CPU_CATS = ("cpu_op", "user_annotation", "cuda_runtime")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def raw(path: Path) -> bytes:
    path = Path(path)
    return gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()


def load(path: Path) -> dict:
    return json.loads(raw(path))


def to_ns(trace: dict, ts) -> int:
    """Absolute epoch ns of a `ts` (modern: relative float µs; 2022: absolute int µs)."""
    if "baseTimeNanoseconds" in trace:
        return trace["baseTimeNanoseconds"] + round(ts * 1000)
    return ts * 1000


def dur_ns(dur) -> int:
    return round(dur * 1000)


def interval(trace, e) -> tuple[int, int]:
    t = to_ns(trace, e["ts"])
    return t, t + dur_ns(e["dur"])


def recount(trace: dict) -> dict:
    """The counts truth.json promises, recounted from the file."""
    ev = trace["traceEvents"]
    by_cat = Counter(e["cat"] for e in ev if "cat" in e)
    ops = Counter(C10D[e["name"]] for e in ev if e.get("cat") == "cpu_op" and e["name"] in C10D)
    return {
        "num_events": len(ev),
        "events_by_cat": dict(by_cat),
        "num_kernels": by_cat["kernel"],
        "num_nccl_kernels": sum(1 for e in ev if e.get("cat") == "kernel"
                                and e["name"].startswith("nccl")),
        "collectives_by_op": dict(ops),
        "num_wait": sum(1 for e in ev if e.get("name") == "record_param_comms"
                        and e["args"].get("Collective name") == "wait"),
        "num_p2p_send": ops["send"],
        "num_p2p_recv": ops["recv"],
        "num_cuda_graph_launches": sum(1 for e in ev if e.get("cat") == "cuda_runtime"
                                       and e["name"] == "cudaGraphLaunch"),
    }


def by_thread(trace: dict, cats=CPU_CATS) -> dict:
    out = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") in cats:
            out[(e["pid"], e["tid"])].append(e)
    return out


def nesting_violations(trace: dict, events) -> int:
    """Partial overlaps among intervals on one thread (proper nesting allows none)."""
    spans = sorted((s, -e, i) for i, (s, e) in enumerate(interval(trace, x) for x in events))
    stack, bad = [], 0
    for s, neg_e, _ in spans:
        e = -neg_e
        while stack and stack[-1] <= s:
            stack.pop()
        if stack and e > stack[-1]:
            bad += 1
        stack.append(e)
    return bad


class Timeline:
    """One thread's events sorted by start, to find what lies inside an interval quickly."""

    def __init__(self, trace, events):
        spans = sorted((interval(trace, e), i) for i, e in enumerate(events))
        self.starts = [s for (s, _), _ in spans]
        self.items = [(s, e, events[i]) for (s, e), i in spans]

    def inside(self, s: int, e: int) -> list[dict]:
        """Events that start and end within [s, e]."""
        lo, hi = bisect_left(self.starts, s), bisect_right(self.starts, e)
        return [x for xs, xe, x in self.items[lo:hi] if xe <= e]
