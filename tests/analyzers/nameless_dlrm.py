"""An 8-rank DLRM-style job traced with NCCL and no process-group names, named after the public
V100 trace that showed it (issue 21, item 4): a minimal Kineto trace set with the shape of that
job's traces, for the cases where the original cannot be committed.

What the original has and these files copy: ProfilerStep#N ranges; record_param_comms CPU ops with
the collective's name, sizes and dtype but no "Process Group Name", "Process Group Ranks" or
"Seq"; nccl:all_to_all / nccl:all_reduce annotations inside them; cudaLaunchKernel runtime events
joined by correlation to ncclKernel_* kernels on the NCCL stream; distributedInfo with backend, rank
and world_size only (no pg_config); every rank on one host.

Each step on each rank: the host reads its batch (rank `late_rank` takes `delay_us` longer), then
launches bottom MLP and embedding lookups, a forward all-to-all, top MLP forward and backward, a
backward all-to-all, the embedding backward, an all-reduce of the dense gradients and the
optimizer, and waits for the device at the end of the step. Collective kernels start when their
rank's stream reaches them and end, on every rank, a transfer time after the last rank arrived -
so the late rank's peers spend its delay waiting inside the first all-to-all.

`disagree`: ranks whose all-reduce in every step has a different size (a desynchronised program).
`group_size`: the "Group size" the calls trace (a job of smaller nameless groups traces theirs).
Stdlib only: the tests read these files back with their own reader, not bprof's.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

WORLD = 8
HOST = "dlrm-v100-node0"
BASE_NS = 1_650_000_000_000_000_000
T0_US = 1_000.0
COMPUTE_STREAM = 7
NCCL_STREAM = 24
LAUNCH_US = 8.0  # a cudaLaunchKernel call
LAUNCH_GAP_US = 30.0  # host time between two launches
LAUNCH_LATENCY_US = 5.0  # from a launch to the earliest start of its kernel
BATCH_US = 150.0  # reading a batch, on a rank that is not late
SYNC_TAIL_US = 40.0  # from the device's last kernel to the end of the step's range
STEP_GAP_US = 20.0  # between two steps' ranges

A2A_ELEMS = 2048 * 26 * 64  # embedding outputs sent per rank (float)
DENSE_ELEMS = 1_310_721  # dense gradients all-reduced (float)

# the device work of a step, in stream order: (kind, name, duration us or transfer us, elems)
WORK = [
    ("compute", "volta_sgemm_128x64_nn", 800.0, None),
    ("compute", "void embedding_forward_kernel<float>(float const*, long const*, float*)", 1200.0, None),
    ("all_to_all", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 300.0, A2A_ELEMS),
    ("compute", "volta_sgemm_128x128_nt", 1500.0, None),
    ("compute", "volta_sgemm_64x64_tn", 1000.0, None),
    ("all_to_all", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", 300.0, A2A_ELEMS),
    ("compute", "void embedding_backward_kernel<float>(float const*, long const*, float*)", 1000.0, None),
    ("all_reduce", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", 400.0, DENSE_ELEMS),
    ("compute", "void at::native::fused_sgd_kernel<float>(float*, float const*)", 300.0, None),
]
CPU_NAME = {"compute": "aten::addmm", "all_to_all": "alltoall_base", "all_reduce": "allreduce"}


def _jitter_us(rank: int, step: int, i: int) -> float:
    """A small deterministic spread (0-9 us) so that no two ranks run identically."""
    return float((rank * 7 + step * 3 + i * 5) % 10)


def simulate(late_rank: int = 7, delay_us: float = 7500.0, steps=range(5, 11), disagree=(),
             group_size: int = WORLD) -> dict[int, list[dict]]:
    """Every rank's events (Kineto 'X' events and ac2g flows) of all steps."""
    events: dict[int, list[dict]] = {r: [] for r in range(WORLD)}
    corr = {r: 1000 * (r + 1) for r in range(WORLD)}
    ext = {r: 0 for r in range(WORLD)}
    step_start = T0_US

    def add(r, **e):
        ext[r] += 1
        e.setdefault("args", {})
        e["args"] = {"External id": ext[r], **e["args"]}
        events[r].append({"ph": "X", **e})

    for step in steps:
        host = {r: step_start for r in range(WORLD)}  # each rank's host cursor
        stream_free = {r: 0.0 for r in range(WORLD)}  # when each rank's device is free
        launches = {r: [] for r in range(WORLD)}  # (cpu_ts, kernel_ts, kernel_dur, i)
        for r in range(WORLD):
            batch = BATCH_US + (delay_us if r == late_rank else 0.0)
            add(r, cat="cpu_op", name="enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                pid=r, tid=r, ts=host[r], dur=batch)
            host[r] += batch + 10.0
        for i, (kind, name, us, elems) in enumerate(WORK):
            ready = {}
            for r in range(WORLD):
                cpu_ts = host[r]
                host[r] += LAUNCH_GAP_US
                ready[r] = max(cpu_ts + LAUNCH_LATENCY_US + 1.0, stream_free[r])
                launches[r].append(cpu_ts)
            if kind == "compute":
                for r in range(WORLD):
                    dur = us + _jitter_us(r, step, i)
                    _emit(add, events, corr, r, launches[r][-1], name, kind, ready[r], dur, None, disagree, group_size)
                    stream_free[r] = ready[r] + dur
            else:
                end = max(ready.values()) + us
                for r in range(WORLD):
                    _emit(add, events, corr, r, launches[r][-1], name, kind, ready[r], end - ready[r], elems, disagree,
                          group_size)
                    stream_free[r] = end
        step_end = max(stream_free.values()) + SYNC_TAIL_US
        for r in range(WORLD):
            add(r, cat="cpu_op", name="cudaStreamSynchronize", pid=r, tid=r, ts=host[r], dur=step_end - 5.0 - host[r])
            add(r, cat="user_annotation", name=f"ProfilerStep#{step}", pid=r, tid=r, ts=step_start,
                dur=step_end - step_start)
        step_start = step_end + STEP_GAP_US
    return events


def _emit(add, events, corr, r, cpu_ts, kernel, kind, kernel_ts, kernel_dur, elems, disagree, group_size):
    if kind == "compute":
        add(r, cat="cpu_op", name=CPU_NAME[kind], pid=r, tid=r, ts=cpu_ts, dur=LAUNCH_US + 4.0)
        stream = COMPUTE_STREAM
    else:
        if kind == "all_reduce" and r in disagree:
            elems = elems + 1024
        # the call: record_param_comms without group, then the nccl:* range, then the launch
        add(r, cat="cpu_op", name="record_param_comms", pid=r, tid=r, ts=cpu_ts - 3.0, dur=LAUNCH_US + 12.0,
            args={"Collective name": CPU_NAME[kind], "In msg nelems": elems, "Out msg nelems": elems,
                  "Group size": group_size, "dtype": "Float", "In split size": "[]", "Out split size": "[]"})
        add(r, cat="user_annotation", name=f"nccl:{kind}", pid=r, tid=r, ts=cpu_ts - 1.0, dur=LAUNCH_US + 6.0)
        stream = NCCL_STREAM
    corr[r] += 1
    c = corr[r]
    add(r, cat="cuda_runtime", name="cudaLaunchKernel", pid=r, tid=r, ts=cpu_ts, dur=LAUNCH_US,
        args={"cbid": 211, "correlation": c})
    events[r].append({"ph": "s", "id": c, "pid": r, "tid": r, "ts": cpu_ts, "cat": "ac2g", "name": "ac2g"})
    events[r].append({"ph": "f", "id": c, "pid": 0, "tid": stream, "ts": kernel_ts, "cat": "ac2g", "name": "ac2g",
                      "bp": "e"})
    add(r, cat="kernel", name=kernel, pid=0, tid=stream, ts=kernel_ts, dur=kernel_dur,
        args={"queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": c,
              "grid": [80, 1, 1], "block": [256, 1, 1]})


def write_run(out: Path, late_rank: int = 7, delay_us: float = 7500.0, steps=range(5, 11), disagree=(),
              group_size: int = WORLD) -> Path:
    """Write rank{r}.json.gz for the 8 ranks under `out`; returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    for r, evs in simulate(late_rank, delay_us, steps, disagree, group_size).items():
        trace = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "Tesla V100-SXM2-32GB", "totalGlobalMem": 34089730048,
                                  "computeMajor": 7, "computeMinor": 0, "maxThreadsPerBlock": 1024, "numSms": 80}],
            "distributedInfo": {"backend": "nccl", "rank": r, "world_size": WORLD},
            "host_name": HOST,
            "traceEvents": sorted(evs, key=lambda e: e["ts"]),
            "traceName": f"dlrm_rank{r}.pt.trace.json",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_NS,
        }
        with gzip.open(out / f"rank{r}.json.gz", "wt") as f:
            json.dump(trace, f)
    return out


if __name__ == "__main__":
    import sys

    print(write_run(Path(sys.argv[1] if len(sys.argv) > 1 else "nameless_dlrm")))
