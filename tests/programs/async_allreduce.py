"""A training program in the style users write without DDP: a plain MLP, forward and backward, then
the gradients averaged by hand - one torch.distributed.all_reduce per parameter, either
asynchronous (async_op=True, the works collected and waited only after more host work: the next
batch fetched and the loss logged) or synchronous, one after the other.

Faults come from outside the model, chosen by flags:
  --slow-rank R --slow-ms MS     extra compute on rank R before its forward, every step
  --mode {async,sync}            how the gradients are all-reduced
  --host-ms MS                   host work between issuing the async all-reduces and waiting for them
  --storm N                      N metrics (one float each) all-reduced one by one after every step
  --batched                      with --storm: the same N metrics stacked and all-reduced in one call
                                 (the counterfactual of the coalesce-small what-if)
  --storm-times PREFIX           with --storm: each rank appends "step seconds" of its metrics'
                                 all-reduces (perf_counter, outside the trace) to PREFIX.<rank>
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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--mode", choices=["async", "sync"], default="async")
    p.add_argument("--host-ms", type=float, default=5.0)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--storm", type=int, default=0)
    p.add_argument("--batched", action="store_true")
    p.add_argument("--storm-times", default="")
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    slow = rank == a.slow_rank and a.slow_ms > 0
    layers = []
    for _ in range(a.layers):
        layers += [nn.Linear(a.dim, a.dim), nn.GELU()]
    model = nn.Sequential(*layers)
    for p_ in model.parameters():  # the same start on every rank
        dist.broadcast(p_.data, 0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    batch = torch.randn(a.batch, a.dim, generator=g), torch.randn(a.batch, a.dim, generator=g)
    for step in range(a.steps):
        x, y = batch
        if slow:
            busy(a.slow_ms)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        if a.mode == "async":
            works = [dist.all_reduce(p_.grad, async_op=True) for p_ in model.parameters()]
            # host work while the all-reduces run: the next batch and the loss's logging
            batch = torch.randn(a.batch, a.dim, generator=g), torch.randn(a.batch, a.dim, generator=g)
            busy(a.host_ms, "work/host")
            if step % 5 == 0 and rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            for w in works:
                w.wait()
        else:
            for p_ in model.parameters():
                dist.all_reduce(p_.grad)
            batch = torch.randn(a.batch, a.dim, generator=g), torch.randn(a.batch, a.dim, generator=g)
        for p_ in model.parameters():
            p_.grad /= world
        opt.step()
        opt.zero_grad()
        # metrics logged the way many trainers do: each value averaged over the ranks on its own
        # timed from outside the trace: a range around them would hide the Python between the calls
        # from bprof (a CPU trace's ranges count as busy)
        started = time.perf_counter()
        if a.storm and a.batched:
            dist.all_reduce(torch.cat([loss.detach().reshape(1) * (i + 1) for i in range(a.storm)]))
        else:
            for i in range(a.storm):
                metric = loss.detach().reshape(1) * (i + 1)
                dist.all_reduce(metric)
        if a.storm and a.storm_times:
            with open(f"{a.storm_times}.{rank}", "a") as f:
                f.write(f"{step} {time.perf_counter() - started:.9f}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
