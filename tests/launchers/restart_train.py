"""A small DDP training script (gloo) for torchrun's elastic restarts: rank --crash-rank raises at
iteration --crash-at the first time (the --marker file it creates says it did), torchrun restarts
every worker (--max-restarts), and the second attempt trains from the start to the end."""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--crash-rank", type=int, default=1)
p.add_argument("--crash-at", type=int, default=4)
p.add_argument("--marker", required=True)
args = p.parse_args()

attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
# torch 2.13's torchrun keeps one store across restarts, and gloo's rendezvous of a restarted
# worker then reads the dead attempt's addresses (connectFullMesh: connection refused), with or
# without bprof: each attempt rendezvouses under its own prefix, as a restartable script must here
store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store), rank=int(os.environ["RANK"]),
                        world_size=int(os.environ["WORLD_SIZE"]))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(args.steps):
    if rank == args.crash_rank and i == args.crash_at and not os.path.exists(args.marker):
        open(args.marker, "w").write(f"rank {rank} crashed at iteration {i} of attempt {attempt}\n")
        time.sleep(0.2)  # the other rank is waiting in this iteration's all-reduce when this one dies
        raise RuntimeError(f"restart_train: planned crash of rank {rank} at iteration {i}")
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
print(f"restart_train: rank {rank} attempt {attempt} done", flush=True)
dist.destroy_process_group()
# as tests/profiler/toy_train.py: the atexit handlers (bprof's recorder among them), then leave without
# interpreter finalization, where torch 2.13 + gloo can abort (examples/train_gpt.py exit_without_finalizing)
import atexit  # noqa: E402

atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(0)
