"""A small training program as users write it, for the CI gate's end-to-end test: an MLP wrapped in
torch.nn.parallel.DistributedDataParallel on gloo (bucketed all-reduces launched from autograd
hooks during backward), a plain SGD loop; torchrun starts it, bprof record captures it.

Slowdowns come from outside the model and execute no matmul, so the executed FLOPs and the
collectives stay those of an unchanged run and only the time metrics can see them:
  --cold-ms MS                      every rank computes MS more per step (a cold-start run)
  --slow-rank R --slow-ms MS        rank R computes MS more before each forward (a straggler)
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def busy(ms: float) -> None:
    """Elementwise compute for about `ms` milliseconds (no matmul: nothing the FLOP count includes)."""
    end = time.perf_counter() + ms / 1e3
    a = torch.rand(256, 256)
    while time.perf_counter() < end:
        a = torch.tanh(a + 0.5)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--cold-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [nn.Linear(a.dim, a.dim), nn.GELU()]
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for _ in range(a.steps):
        x, y = torch.randn(a.batch, a.dim, generator=g), torch.randn(a.batch, a.dim, generator=g)
        extra_ms = a.cold_ms + (a.slow_ms if rank == a.slow_rank else 0.0)
        if extra_ms:
            busy(extra_ms)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
