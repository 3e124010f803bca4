"""A real MoE token dispatch, for tests: each step every rank routes its tokens to the experts (one
per rank) with an uneven torch.distributed all_to_all_single, runs its expert, and sends the tokens
back. --skew F sends F times as many tokens to expert 0 as to each other expert. Run under
torchrun (gloo, CPU); iterations are counted by the optimizer step, so `bprof record` needs no
change to it."""

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--tokens", type=int, default=256, help="tokens per rank and expert when balanced")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--skew", type=float, default=1.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    expert = torch.nn.Linear(args.hidden, args.hidden)
    opt = torch.optim.SGD(expert.parameters(), lr=1e-3)
    send = [round(args.tokens * (args.skew if e == 0 else 1.0)) for e in range(world)]
    counts = torch.empty(world, dtype=torch.long)
    dist.all_to_all_single(counts, torch.tensor(send))   # how many tokens each expert will receive
    recv = counts.tolist()
    for _ in range(args.steps):
        x = torch.randn(sum(send), args.hidden)
        routed = torch.empty(sum(recv), args.hidden)
        dist.all_to_all_single(routed, x, output_split_sizes=recv, input_split_sizes=send)
        y = expert(routed)
        back = torch.empty(sum(send), args.hidden)
        dist.all_to_all_single(back, y.detach(), output_split_sizes=send, input_split_sizes=recv)
        y.sum().backward()
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)   # torch 2.13 + gloo can abort at interpreter exit (README, "Capture")


if __name__ == "__main__":
    main()
