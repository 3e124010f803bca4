"""A tiny DDP training script for capture tests: knows nothing of bprof unless told to.

Flags make it misbehave in the ways `bprof record` must survive: a non-zero exit code, a rank
killed mid-run, its own torch.profiler session, a loop with no optimizer (bprof.step()).
"""

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--sleep-ms", type=float, default=0.0)
p.add_argument("--exit-code", type=int, default=0)
p.add_argument("--kill-rank", type=int, default=None)
p.add_argument("--kill-at", type=int, default=3)
p.add_argument("--own-profiler", default=None, help="A:B: run torch.profiler over these iterations")
p.add_argument("--no-optimizer", action="store_true", help="plain loop, iterations marked with bprof.step()")
p.add_argument("--gc", action="store_true", help="a full garbage collection every iteration")
p.add_argument("--ready-file", default=None, help="touched after the first iteration")
p.add_argument("--annotate", action="store_true", help="wrap the forward in bprof.annotate('toy/forward')")
args = p.parse_args()

distributed = "RANK" in os.environ
if distributed:
    dist.init_process_group("gloo")
rank = dist.get_rank() if distributed else 0
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
if distributed:
    model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.004)  # several C++ buckets
opt = torch.optim.SGD(model.parameters(), lr=0.01)
own = None
for i in range(args.steps):
    if args.own_profiler and i == int(args.own_profiler.split(":")[0]):
        own = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        own.start()
    if args.own_profiler and own is not None and i == int(args.own_profiler.split(":")[1]):
        own.stop()
        own.export_chrome_trace(os.path.join(os.environ.get("OWN_TRACE_DIR", "."), f"own_rank{rank}.json"))
        own = None
    if args.kill_rank == rank and i == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if args.gc:
        import gc

        gc.collect()
    if args.annotate:
        import bprof

        with bprof.annotate("toy/forward"):
            loss = model(torch.randn(16, 32)).pow(2).mean()
    else:
        loss = model(torch.randn(16, 32)).pow(2).mean()
    loss.backward()
    if args.no_optimizer:
        with torch.no_grad():
            for q in model.parameters():
                q -= 0.01 * q.grad
                q.grad = None
        import bprof

        bprof.step()
    else:
        opt.step()
        opt.zero_grad()
    if args.sleep_ms:
        time.sleep(args.sleep_ms / 1000)
    if args.ready_file and i == 0 and rank == 0:
        open(args.ready_file, "w").close()
print(f"toy rank {rank} done", flush=True)
if distributed:
    dist.destroy_process_group()
# Leave without interpreter finalization, after the atexit handlers (bprof's recorder among them):
# with torch 2.13 and gloo a worker thread may still hold a finished collective's work, whose saved
# contextvars.Context it cannot release once finalization began -> std::terminate, SIGABRT (1 run
# in 12 beside two busy loops, with or without bprof; see examples/train_gpt.py exit_without_finalizing).
import atexit

atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(args.exit_code)
