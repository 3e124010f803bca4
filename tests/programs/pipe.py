"""A training program in the style users write with torch.distributed.pipelining: an MLP cut by hand
into one stage per rank (PipelineStage, as torchtitan builds them), run by ScheduleGPipe or
Schedule1F1B over micro-batches (the stages exchange activations and gradients by send/recv), each
stage stepping its own optimizer.

Faults come from outside the model, chosen by flags:
  --heavy-stage S --heavy-ms MS   stage S computes MS more in each micro-batch's forward
Run under torchrun (gloo, CPU), one stage per rank.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

import faults  # tests/programs/faults.py, beside this script

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def busy(ms: float) -> None:
    faults.busy(ms, "fault/heavy_stage")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=8, help="in all, split evenly over the stages")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--heavy-stage", type=int, default=-1)
    p.add_argument("--heavy-ms", type=float, default=0.0)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    layers = []
    for _ in range(a.layers):
        layers += [nn.Linear(a.dim, a.dim), nn.GELU()]
    per_stage = len(layers) // world
    module = nn.Sequential(*layers[rank * per_stage:(rank + 1) * per_stage])
    if rank == a.heavy_stage and a.heavy_ms > 0:
        module.register_forward_pre_hook(lambda m, x: busy(a.heavy_ms))
    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule = SCHEDULES[a.schedule](stage, n_microbatches=a.microbatches,
                                     loss_fn=lambda out, target: nn.functional.mse_loss(out, target))
    opt = torch.optim.SGD(module.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)  # every rank draws the same batch
    for _ in range(a.steps):
        x, y = torch.randn(a.batch, a.dim, generator=g), torch.randn(a.batch, a.dim, generator=g)
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            losses = []
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
