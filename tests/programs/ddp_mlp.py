"""A training program in the style users write, not bprof's example trainer: an MLP wrapped in
torch.nn.parallel.DistributedDataParallel (the C++ reducer: bucketed all-reduces launched from
autograd hooks during backward, waited at the end of backward), a plain optimizer loop.

Faults come from outside the model, chosen by flags:
  --slow-rank R --slow-ms MS --slow-where {before,forward,hook}   extra compute on rank R
  --slow-from N                                                   ... from iteration N on only
  --bucket-cap-mb MB, --grad-as-bucket-view, --no-sync-every K    DDP's own options
  --stall-ms MS                                                   a DataLoader whose dataset stalls
Run under torchrun (gloo, CPU).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import faults  # tests/programs/faults.py, beside this script

busy = faults.busy


class Stalling(torch.utils.data.Dataset):
    def __init__(self, n: int, dim: int, stall_ms: float):
        self.n, self.dim, self.stall_ms = n, dim, stall_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.stall_ms:
            time.sleep(self.stall_ms / 1e3 / 8)  # a batch is 8 samples
        g = torch.Generator().manual_seed(i)
        return torch.randn(self.dim, generator=g), torch.randn(self.dim, generator=g)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--slow-where", choices=["before", "forward", "hook"], default="before")
    p.add_argument("--slow-from", type=int, default=0, help="the slow rank is slow from this iteration on")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--grad-as-bucket-view", action="store_true")
    p.add_argument("--no-sync-every", type=int, default=0, help="accumulate K-1 micro-batches under no_sync")
    p.add_argument("--stall-ms", type=float, default=0.0)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    faulty = rank == a.slow_rank and a.slow_ms > 0
    slow = faulty and a.slow_from == 0  # a truth the hooks read: set at iteration --slow-from
    layers = []
    for _ in range(a.layers):
        layers += [nn.Linear(a.dim, a.dim), nn.GELU()]
    model = nn.Sequential(*layers)
    if faulty and a.slow_where == "forward":
        model[0].register_forward_pre_hook(lambda m, x: busy(a.slow_ms) if slow else None)
    if faulty and a.slow_where == "hook":
        # inside backward: a hook on the first layer's input gradient runs late in backward
        model[len(layers) // 2].register_full_backward_hook(lambda m, gi, go: busy(a.slow_ms) if slow else None)
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=a.bucket_cap_mb,
                                              gradient_as_bucket_view=a.grad_as_bucket_view)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    data = torch.utils.data.DataLoader(Stalling(8 * a.steps * max(1, a.no_sync_every), a.dim, a.stall_ms), batch_size=8)
    batches = iter(data)
    for step in range(a.steps):
        slow = faulty and step >= a.slow_from
        micro = max(1, a.no_sync_every)
        for k in range(micro):
            x, y = next(batches)
            if slow and a.slow_where == "before":
                busy(a.slow_ms)
            if k < micro - 1:
                with ddp.no_sync():
                    nn.functional.mse_loss(ddp(x), y).backward()
            else:
                nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
