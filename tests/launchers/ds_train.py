"""A small DeepSpeed training script (CPU accelerator, gloo): deepspeed.initialize with ZeRO stage 1."""

import argparse

import deepspeed
import torch

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--local_rank", type=int, default=0)  # the deepspeed launcher passes it
args = p.parse_args()

deepspeed.init_distributed(dist_backend="gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
config = {"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 1}, "zero_allow_untested_optimizer": True,
          "optimizer": {"type": "SGD", "params": {"lr": 0.01}}, "steps_per_print": 1000}
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
for _ in range(args.steps):
    loss = engine(torch.randn(16, 32)).pow(2).mean()
    engine.backward(loss)
    engine.step()
print(f"ds_train: rank {engine.global_rank} of {engine.world_size} done", flush=True)
