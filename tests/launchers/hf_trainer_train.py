"""The Hugging Face Trainer on CPU (gloo under torchrun): a 1-layer GPT-2 built from its config, no download."""

import argparse

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--out", required=True)
args = p.parse_args()


class Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
training = TrainingArguments(output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=4, use_cpu=True,
                             ddp_backend="gloo", report_to=[], save_strategy="no", logging_strategy="no",
                             dataloader_num_workers=0, disable_tqdm=True)
trainer = Trainer(model=model, args=training, train_dataset=Tokens())
trainer.train()
print(f"hf_trainer_train: rank {training.process_index} of {training.world_size} done", flush=True)
