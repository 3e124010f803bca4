"""A small Hugging Face Accelerate training script (CPU): knows nothing of bprof.

`accelerate launch --cpu` runs it as one process without RANK; `--multi_cpu --num_processes N`
as N gloo ranks. A DataLoader with --workers worker processes (helpers bprof must not record).
"""

import argparse

import torch
from accelerate import Accelerator

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--workers", type=int, default=0)
args = p.parse_args()

accelerator = Accelerator(cpu=True)
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(16 * args.steps * accelerator.num_processes, 32))
loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=args.workers)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt, loader = accelerator.prepare(model, opt, loader)
for (x,) in loader:
    loss = model(x).pow(2).mean()
    accelerator.backward(loss)
    opt.step()
    opt.zero_grad()
accelerator.wait_for_everyone()
print(f"acc_train: process {accelerator.process_index} of {accelerator.num_processes} done", flush=True)
