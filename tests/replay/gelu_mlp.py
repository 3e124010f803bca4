"""A real data-parallel trainer for tests: an MLP whose activation is the tanh GELU written out in
eager ops, as GPT-2's code and Hugging Face's NewGELUActivation write it
(0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))): seven elementwise ops that torch.compile fuses
into one. DDP over gloo ranks under torchrun (CPU); iterations are counted by the optimizer step, so
`bprof record` needs no change to it."""

import argparse
import math
import os

import torch
import torch.distributed as dist


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class MLP(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(hidden, 4 * hidden)
        self.fc2 = torch.nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.fc2(gelu_new(self.fc1(x)))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--hidden", type=int, default=128)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(MLP(args.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(args.steps):
        x = torch.randn(args.tokens, args.hidden, generator=gen)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)   # torch 2.13 + gloo can abort at interpreter exit (README, "Capture")


if __name__ == "__main__":
    main()
