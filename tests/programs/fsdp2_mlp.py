"""A training program in the style users write with FSDP2: an MLP whose every layer and the root are
wrapped by torch.distributed.fsdp.fully_shard (parameters sharded as DTensors; each layer's
all-gather before its forward, its reduce-scatter after its backward; reshard_after_forward as
default), the next layer's all-gather issued early by explicit forward and backward prefetch.

Faults come from outside the model, chosen by flags:
  --slow-rank R --slow-ms MS     extra compute on rank R before its forward, every step
  --no-prefetch                  FSDP2's implicit order only
Run under torchrun (gloo, CPU).
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

import faults  # tests/programs/faults.py, beside this script

busy = faults.busy


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x):
        return nn.functional.gelu(self.linear(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--no-prefetch", action="store_true")
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    slow = rank == a.slow_rank and a.slow_ms > 0
    model = nn.Sequential(*[Block(a.dim) for _ in range(a.layers)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    if not a.no_prefetch:
        blocks = list(model)
        for here, after in zip(blocks, blocks[1:]):
            here.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([here])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    for _ in range(a.steps):
        x, y = torch.randn(a.batch, a.dim, generator=g), torch.randn(a.batch, a.dim, generator=g)
        if slow:
            busy(a.slow_ms)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
