"""Collective replay: a real process group (gloo on CPU, nccl on GPUs) of the recorded size, bounded by
what this machine can run, times each recorded collective with warm-up and repeats.

The ranks are `python -m bprof.replay.comm` processes; rank 0 writes the timings as JSON. Each
repeat starts after a barrier and lasts until the slowest rank is done (max over ranks).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bprof.errors import DeviceError
from bprof.replay.plan import COLLECTIVE_VARIANTS, CollItem, resized_calls, spread_of
from bprof.replay.results import ReplayResult, classify, judge, samples_result

# nccl-tests bus-bandwidth factors (n = ranks), as collperf uses them
BUSBW = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
         "reduce_scatter": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
         "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0}
DTYPES = {"float": "float32", "float32": "float32", "double": "float64", "bfloat16": "bfloat16",
          "c10::bfloat16": "bfloat16", "half": "float16", "float16": "float16", "c10::half": "float16",
          "long": "int64", "long int": "int64", "int": "int32"}


def replay_collectives(items: list[CollItem], *, device: str, repeats: int, max_ranks: int | None,
                       num_threads: int | None, variants: tuple[str, ...] = COLLECTIVE_VARIANTS, min_time_s: float = 0.02,
                       timeout_s: float = 300) -> list[ReplayResult]:
    """Baseline replays of each item, plus its message-size variants (plan.COLLECTIVE_VARIANTS: the same
    bytes per step in other calls), timed interleaved in one process group per group size."""
    limit = max_ranks or (os.cpu_count() or 2)
    if device == "cuda":
        import torch
        limit = min(limit, torch.cuda.device_count())
    results: list[ReplayResult] = []
    by_size: dict[int, list[CollItem]] = {}
    for item in items:
        base = _base(item, device, num_threads)
        if item.op not in BUSBW:
            base.reason = f"{item.op} is not replayed (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, reduce are)"
            results.append(base)
        elif limit < 2:
            base.status, base.reason = "failed", f"a process group needs 2 ranks; this machine can run {limit}"
            results.append(base)
        else:
            by_size.setdefault(min(item.group_size, limit), []).append(item)
    for size, group in by_size.items():
        programs = {}
        for k, item in enumerate(group):
            programs[f"{k}:baseline"] = [(item.op, item.dtype, e) for e in item.elems]
            for variant in variants:
                calls = resized_calls(variant, item.kind, item.elems)
                if calls is not None:
                    programs[f"{k}:{variant}"] = [(item.op, item.dtype, e) for e in calls]
        timings = run_group(programs, size, device=device, repeats=repeats, num_threads=num_threads, timeout_s=timeout_s,
                            min_time_s=min_time_s)
        for k, item in enumerate(group):
            base = samples_result(_base(item, device, num_threads), timings[f"{k}:baseline"])
            base.replayed_group_size = size
            if size < item.group_size:
                base.reason = f"replayed over {size} ranks, the most this machine runs; the recorded group had {item.group_size}"
            base.busbw_bytes_per_s = _busbw(item, sum(item.elems), size, base.replayed_ns)
            base.classification = classify(item.traced_ns, base.replayed_samples_ns)
            results.append(base)
            for variant in variants:
                if f"{k}:{variant}" not in timings:
                    continue
                calls = [e for _, _, e in programs[f"{k}:{variant}"]]
                v = samples_result(_base(item, device, num_threads), timings[f"{k}:{variant}"])
                v.variant, v.replayed_group_size, v.baseline_ns = variant, size, base.replayed_ns
                v.shapes = calls
                v.reason = (f"the same {sum(item.elems):,} elements per step in {len(calls)} {item.op} call(s) "
                            f"instead of {len(item.elems)}")
                v.speedup, v.verdict = judge(timings[f"{k}:{variant}"], timings[f"{k}:baseline"])
                v.busbw_bytes_per_s = _busbw(item, sum(item.elems), size, v.replayed_ns)
                results.append(v)
    return results


def _base(item: CollItem, device: str, num_threads: int | None) -> ReplayResult:
    return ReplayResult(item.kind, item.label, item.key, item.rank, "baseline", "not_applicable", device,
                        shapes=item.elems, dtypes=[item.dtype], num_threads=num_threads, calls_per_step=item.calls_per_step,
                        traced_ns=int(statistics.median(item.traced_ns)), traced_spread_frac=spread_of(item.traced_ns),
                        traced_basis=item.traced_basis, group_size=item.group_size, bytes=sum(item.elems) * item.bytes_per_elem,
                        finding_id=item.finding_id, finding_title=item.finding_title)


def _busbw(item: CollItem, elems: int, n: int, ns: int | None) -> float | None:
    if not ns:
        return None
    return elems * item.bytes_per_elem / (ns * 1e-9) * BUSBW[item.op](n)


def run_group(programs: dict[str, list], size: int, *, device: str, repeats: int, num_threads: int | None,
              timeout_s: float, min_time_s: float = 0.02) -> dict[str, list[float]]:
    """Start `size` ranks, run every program (a list of (op, dtype, elements) calls) warm-up + `repeats`
    times, interleaved, each repeat a batch of runs lasting >= min_time_s; seconds per program run, max over ranks."""
    with tempfile.TemporaryDirectory(prefix="bprof-replay-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"programs": programs, "repeats": repeats, "device": device, "threads": num_threads,
                                    "min_time_s": min_time_s}))
        port = _free_port()
        procs = [subprocess.Popen([sys.executable, "-m", "bprof.replay.comm", str(spec), str(rank), str(size), str(port)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for rank in range(size)]
        deadline = time.monotonic() + timeout_s
        errors = []
        for p in procs:
            try:
                _, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise DeviceError(f"collective replay over {size} ranks did not finish in {timeout_s:.0f} s") from None
            if p.returncode != 0:
                errors.append((err or "").strip().splitlines()[-1:] or [f"exit {p.returncode}"])
        out = Path(tmp) / "timings.json"
        if errors or not out.exists():
            raise DeviceError(f"collective replay over {size} ranks failed: {errors[0][0] if errors else 'no timings written'}")
        return json.loads(out.read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(spec_path: str, rank: int, size: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    spec = json.loads(Path(spec_path).read_text())
    if spec["threads"]:
        torch.set_num_threads(spec["threads"])
    cuda = spec["device"] == "cuda"
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    buffers = {name: [_buffers(torch, dist, op, dtype, elems, size, dev) for op, dtype, elems in calls]
               for name, calls in spec["programs"].items()}

    def run(name):
        for call in buffers[name]:
            call()
        if cuda:
            torch.cuda.synchronize(dev)

    elapsed = torch.zeros(1, dtype=torch.float64, device=dev)

    def timed(name, calls):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            run(name)
        elapsed[0] = time.perf_counter() - t0
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank's time
        return float(elapsed[0]) / calls

    calls = {}
    for name in buffers:  # warm-up (connections, algorithm choice, allocations), then a batch of >= min_time_s
        run(name)
        calls[name] = max(1, math.ceil(spec["min_time_s"] / max(timed(name, 1), 1e-9)))
    timings = {name: [] for name in buffers}
    for _ in range(spec["repeats"]):
        for name in buffers:
            timings[name].append(timed(name, calls[name]))
    if rank == 0:
        (Path(spec_path).parent / "timings.json").write_text(json.dumps(timings))
    dist.barrier()
    dist.destroy_process_group()


def _buffers(torch, dist, op: str, dtype: str | None, elems: int, size: int, dev):
    dt = getattr(torch, DTYPES.get((dtype or "float").lower(), "float32"))
    x = torch.ones(elems, dtype=dt, device=dev)
    if op == "all_reduce":
        return lambda: dist.all_reduce(x)
    if op == "broadcast":
        return lambda: dist.broadcast(x, src=0)
    if op == "reduce":
        return lambda: dist.reduce(x, dst=0)
    if op == "all_gather":
        out = torch.empty(elems * size, dtype=dt, device=dev)
        return lambda: dist.all_gather_into_tensor(out, x)
    if op == "reduce_scatter":
        big = torch.ones(elems - elems % size or size, dtype=dt, device=dev)
        out = torch.empty(big.numel() // size, dtype=dt, device=dev)
        return lambda: dist.reduce_scatter_tensor(out, big)
    if op == "all_to_all":
        x = torch.ones(elems - elems % size or size, dtype=dt, device=dev)
        out = torch.empty_like(x)
        return lambda: dist.all_to_all_single(out, x)
    raise ValueError(f"cannot replay {op}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one rank of a bprof collective replay (started by bprof replay)")
    parser.add_argument("spec")
    parser.add_argument("rank", type=int)
    parser.add_argument("size", type=int)
    parser.add_argument("port", type=int)
    a = parser.parse_args()
    _worker(a.spec, a.rank, a.size, a.port)
    # leave without interpreter finalization: with gloo, a worker thread holding a finished work's
    # Python context can abort the exit after the work is done (see examples/train_gpt.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
