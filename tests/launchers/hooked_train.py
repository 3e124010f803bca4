"""A plain training loop whose own code registers a global optimizer-step post-hook (as some
libraries do), after bprof's: a hook bprof adds while torch runs these would break the step."""

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

num_hook_calls = []
register_optimizer_step_post_hook(lambda optimizer, args, kwargs: num_hook_calls.append(1))
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(6):
    model(torch.randn(16, 32)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
print(f"hooked_train: done, the script's hook ran {len(num_hook_calls)} times", flush=True)
