"""Is `bprof replay`'s collective timing the machine's own? A plain loop of gloo all_reduce calls
between two local processes, outside bprof, against bprof.replay.comm.run_group on the same sizes,
in the same run (so the ratio holds on a noisy machine even when the absolute times drift).

    .venv/bin/python benchmarks/gloo_latency.py [--calls 500] [--repeats 5] [--min-time 0.02]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (128, 65_536)  # floats: the sizes of the example trainer's small all-reduces


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plain(rank: int, size: int, port: int, calls: int, queue) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    per_call_us = {}
    for n in SIZES:
        x = torch.ones(n)
        for _ in range(50):  # warm-up
            dist.all_reduce(x)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(x)
        per_call_us[n] = (time.perf_counter() - t0) / calls * 1e6
    if rank == 0:
        queue.put(per_call_us)
    dist.barrier()
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="all_reduce calls in the plain loop, per size")
    parser.add_argument("--repeats", type=int, default=5, help="run_group repeats")
    parser.add_argument("--min-time", type=float, default=0.02, help="run_group: seconds each timed batch lasts at least")
    args = parser.parse_args()

    import torch.multiprocessing as mp

    from bprof.replay.comm import run_group

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_plain, args=(rank, 2, port, args.calls, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    plain = queue.get(timeout=300)
    for p in procs:
        p.join()
    programs = {str(n): [["all_reduce", "Float", n]] for n in SIZES}
    replayed = run_group(programs, 2, device="cpu", repeats=args.repeats, num_threads=1, timeout_s=300,
                         min_time_s=args.min_time)
    for n in SIZES:
        r_us = [t * 1e6 for t in replayed[str(n)]]
        print(f"all_reduce {n:>6} floats, 2 gloo ranks: plain loop {plain[n]:8.1f} us/call; bprof run_group median "
              f"{statistics.median(r_us):8.1f} us/call (range {min(r_us):.0f}-{max(r_us):.0f}); "
              f"ratio {statistics.median(r_us) / plain[n]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
