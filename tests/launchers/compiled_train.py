"""A small MLP trained with DDP (gloo) under torchrun, the module inside DDP compiled with
torch.compile (inductor) unless --eager: the same program both ways, so the executed FLOPs bprof
counts can be compared. `torch.compile(DDP(model))` is not used: with torch 2.13 Dynamo breaks
the graph at DDP.forward (`_inside_ddp_forward` is on its skip list) and the model runs eager."""

import argparse
import os
import sys

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--eager", action="store_true", help="the same program without torch.compile")
args = p.parse_args()


def compile_workers() -> list[int]:
    """Pids of inductor's compile-worker processes below this one (its subprocess pool)."""
    found = []
    for proc in os.listdir("/proc"):
        try:
            cmdline = open(f"/proc/{proc}/cmdline", "rb").read().split(b"\0")
            ppids = [int(proc)]
            while ppids[-1] > 1:  # walk up to see whether this process is an ancestor
                ppids.append(int(open(f"/proc/{ppids[-1]}/stat").read().rsplit(")", 1)[1].split()[1]))
        except (OSError, ValueError, IndexError):
            continue
        if os.getpid() in ppids[1:] and any(b"compile_worker" in part for part in cmdline):
            found.append(int(proc))
    return sorted(found)


dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
if not args.eager and rank == 0:
    # inductor's compile-worker pool (a sidecar process and its forked workers, each importing
    # torch with the rank's environment, RANK included; on rank 0 only, to spare this 2-core machine): a CUDA build with triton starts it at torch.compile; this
    # CPU build compiles its C++ kernels in threads, so the script starts it as such a build would
    from torch._inductor.async_compile import AsyncCompile

    AsyncCompile.warm_pool()
    AsyncCompile.wakeup()
    AsyncCompile.wait_pool_ready()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256), torch.nn.GELU(),
                            torch.nn.Linear(256, 32))
model = torch.nn.parallel.DistributedDataParallel(model if args.eager else torch.compile(model))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
workers = []
for i in range(args.steps):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    if i == 0 and not args.eager and rank == 0:
        workers = compile_workers()
print(f"compiled_train: compile workers {workers}", flush=True)
print(f"compiled_train: rank {rank} of {world_size} done ({'eager' if args.eager else 'compiled'}), pid {os.getpid()}",
      flush=True)
dist.destroy_process_group()
# as tests/profiler/toy_train.py: the atexit handlers (bprof's recorder among them), then leave without
# interpreter finalization, where torch 2.13 + gloo can abort (examples/train_gpt.py exit_without_finalizing)
import atexit  # noqa: E402

atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
