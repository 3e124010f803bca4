"""A training program in the style users write with Hugging Face Transformers: a GPT-2 causal LM
built from a tiny config (random weights, nothing downloaded), wrapped in
torch.nn.parallel.DistributedDataParallel, trained on random token batches with labels = inputs
(the model shifts them and computes the loss itself), AdamW.

Faults come from outside the model, chosen by flags:
  --slow-rank R --slow-ms MS     extra compute on rank R before its forward, every step
Run under torchrun (gloo, CPU), with HF_HUB_OFFLINE=1.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

import faults  # tests/programs/faults.py, beside this script

busy = faults.busy


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=64)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    slow = rank == a.slow_rank and a.slow_ms > 0
    config = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=2, vocab_size=a.vocab, n_positions=a.seq,
                        bos_token_id=a.vocab - 1, eos_token_id=a.vocab - 1)
    model = torch.nn.parallel.DistributedDataParallel(GPT2LMHeadModel(config))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(rank)
    for _ in range(a.steps):
        ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g)
        if slow:
            busy(a.slow_ms)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
    # torch 2.13 (gloo, CPU) can deadlock at teardown: when the last reference to the process group
    # is DDP's reducer, freeing the model joins gloo's worker threads while holding the GIL, and a
    # worker destroying a finished all-reduce needs the GIL to drop a Python object of its thread
    # state (seen in 1 of 3 plain torchrun runs, without bprof: py-spy showed exactly these two
    # stacks). So: let the workers finish (the barrier, then a sleep that releases the GIL), free the
    # model while the world still holds the group, then destroy the group.
    dist.barrier()
    time.sleep(0.2)
    del model, opt
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
