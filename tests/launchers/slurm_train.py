"""A DDP training script as run by srun: its rank comes from Slurm's variables, three ways.

--rank-from env    maps SLURM_PROCID/NTASKS/LOCALID to RANK/WORLD_SIZE/LOCAL_RANK after `import torch`,
                   then init_process_group("gloo") reads them (env://)
--rank-from args   passes them to init_process_group(rank=, world_size=) and sets no variable
--rank-from none   no process group at all: each task trains alone, and only Slurm's variables say which it is
"""

import argparse
import os

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--rank-from", choices=("env", "args", "none"), required=True)
args = p.parse_args()

rank, world_size = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
if args.rank_from == "env":
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=os.environ["SLURM_LOCALID"])
    dist.init_process_group("gloo")
elif args.rank_from == "args":
    init = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
if dist.is_initialized():
    model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.steps):
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
if dist.is_initialized():
    dist.destroy_process_group()
print(f"slurm_train: task {rank} of {world_size} done", flush=True)
