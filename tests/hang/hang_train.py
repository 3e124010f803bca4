"""A small data-parallel (or 2x2 TP x DP) training program with one hang fault injected from
outside bprof, for `bprof hang`'s tests. Run under torchrun (gloo, CPU).

    HANG_FAULT   none | block | gil | desync | size | dead | tp_block
    HANG_RANK    the faulty rank (default 1)
    HANG_STEP    the step the fault happens at (default 3)
    HANG_DUMP    a prefix: like torch's NCCL watchdog with TORCH_NCCL_DUMP_ON_TIMEOUT=1, every rank
                 writes its Flight Recorder dump to <prefix><rank> when a collective fails (gloo's
                 timeout, a peer gone), when it is told to stop (SIGTERM), or at its end.
    HANG_DUMP_FORMAT  pickle (default) | json
    HANG_PG_TIMEOUT_S gloo's collective timeout (default 6)
    HANG_SLOW_MS      the faulty rank also sleeps this long before every forward pass until the fault
                      (a straggler in a window captured before the hang; default 0)

Faults: block - the rank waits forever in Python before its forward pass; gil - it sleeps in C
holding the GIL there; desync - it skips the
step's broadcast of the "go on" flag; size - it all-reduces its loss with 2 elements (peers: 1);
dead - it kills itself (SIGKILL) before its backward pass; tp_block - in the 2x2 job, a TP rank
waits forever before its TP all-reduce. Without bprof: `bprof record --hang-timeout` may also run it.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

FAULT = os.environ.get("HANG_FAULT", "none")
FAULTY = int(os.environ.get("HANG_RANK", "1"))
FAULT_STEP = int(os.environ.get("HANG_STEP", "3"))
STEPS = int(os.environ.get("HANG_STEPS", "6"))
DUMP = os.environ.get("HANG_DUMP", "")
SLOW_S = float(os.environ.get("HANG_SLOW_MS", "0")) / 1e3
_dumped = False


def dump_flight_recorder(rank: int, frame=None) -> None:
    global _dumped
    if not DUMP or _dumped:
        return
    _dumped = True
    if os.environ.get("HANG_DUMP_FORMAT") == "json":
        data = torch._C._distributed_c10d._dump_fr_trace_json()  # bytes of JSON text
    else:
        data = torch._C._distributed_c10d._dump_fr_trace()
    with open(f"{DUMP}{rank}", "wb") as f:
        f.write(data)
    with open(f"{os.path.dirname(DUMP)}/rank{rank}.stack.txt", "w") as f:
        if frame is None:
            faulthandler.dump_traceback(f, all_threads=True)
        else:  # in a signal handler: the interrupted frame, as faulthandler writes a thread
            f.write(f"Current thread 0x{threading.get_ident():016x} (most recent call first):\n")
            for fs in reversed(traceback.extract_stack(frame)):
                f.write(f'  File "{fs.filename}", line {fs.lineno} in {fs.name}\n')


def hold_gil_forever() -> None:
    """A rank stuck in C code that holds the GIL (ctypes.PyDLL keeps it across the call)."""
    import ctypes

    libc = ctypes.PyDLL(None)
    while True:
        libc.sleep(1000)


def block_forever() -> None:
    threading.Event().wait()  # a rank stuck in Python: a lock, a queue, a dataloader that never returns


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("HANG_PG_TIMEOUT_S", "6")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()

    def on_sigterm(signum, frame):  # torchrun stops the others once one rank has failed
        dump_flight_recorder(rank, frame)
        os._exit(1)

    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        if FAULT == "tp_block":
            train_tp_dp(rank, world, timeout)
        else:
            train_dp(rank, world)
    except RuntimeError as exc:  # gloo: timed out, or a peer's connection closed
        print(f"rank {rank}: collective failed: {str(exc).splitlines()[0][:200]}", file=sys.stderr)
        dump_flight_recorder(rank)
        raise SystemExit(1) from None  # as a script that lets the error end it
    dump_flight_recorder(rank)
    dist.destroy_process_group()


def train_dp(rank: int, world: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    flag = torch.ones(1)
    for step in range(STEPS):
        faulty = rank == FAULTY and step == FAULT_STEP
        if not (faulty and FAULT == "desync"):
            dist.broadcast(flag, src=0)  # rank 0 says "go on"
        x = torch.randn(16, 32)
        if SLOW_S and rank == FAULTY and step < FAULT_STEP:
            time.sleep(SLOW_S)  # late in every step before it hangs
        if faulty and FAULT == "block":
            block_forever()
        if faulty and FAULT == "gil":
            hold_gil_forever()
        loss = model(x).square().mean()
        if faulty and FAULT == "dead":
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()
        opt.step()
        opt.zero_grad()
        logged = loss.detach().reshape(1)
        if faulty and FAULT == "size":
            logged = torch.cat([logged, logged])
        dist.all_reduce(logged)  # the mean loss for the log


def train_tp_dp(rank: int, world: int, timeout) -> None:
    """Megatron-style: TP groups {0,1}, {2,3}; DP groups {0,2}, {1,3} (every rank creates every group)."""
    assert world == 4, "tp_block runs on 4 ranks"
    tp_groups = [dist.new_group([0, 1], group_desc="tp", timeout=timeout), dist.new_group([2, 3], group_desc="tp", timeout=timeout)]
    dp_groups = [dist.new_group([0, 2], group_desc="dp", timeout=timeout), dist.new_group([1, 3], group_desc="dp", timeout=timeout)]
    tp, dp = tp_groups[rank // 2], dp_groups[rank % 2]
    torch.manual_seed(rank % 2)
    w = torch.randn(32, 16, requires_grad=True)  # this TP rank's shard of a column-parallel layer
    opt = torch.optim.SGD([w], lr=0.01)
    for step in range(STEPS):
        x = torch.randn(8, 32)
        partial = x @ w
        if rank == FAULTY and step == FAULT_STEP:
            block_forever()
        out = partial.detach().clone()
        dist.all_reduce(out, group=tp)  # the TP all-reduce of the row-parallel output
        loss = (partial * out).mean()
        loss.backward()
        dist.all_reduce(w.grad, group=dp)  # the DP gradient all-reduce
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
