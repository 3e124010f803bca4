"""What a training script may call (all optional): explicit steps, annotations, declared FLOPs.

Each works whether or not the process runs under `bprof record`; outside it they do nothing
beyond the torch ranges they emit.
"""

from __future__ import annotations

import contextlib

from bprof.profiler import rank_hook


def step() -> None:
    """Mark the end of a training iteration, for loops without an optimizer step."""
    rec = rank_hook.recorder()
    if rec is not None:
        rec.explicit_step()


def set_model_flops(model_flops_per_step: float, executed_flops_per_step: float | None = None, **extra) -> None:
    """Declare the model FLOPs of one optimizer step (MFU); executed FLOPs with recompute (HFU)."""
    rec = rank_hook.recorder()
    if rec is not None:
        rec.model = {"model_flops_per_step": float(model_flops_per_step),
                     "executed_flops_per_step": None if executed_flops_per_step is None else float(executed_flops_per_step),
                     **extra}


class annotate(contextlib.ContextDecorator):
    """`with bprof.annotate("name"):` or `@bprof.annotate("name")`: an NVTX range (Nsight Systems)
    and a profiler range (the Kineto trace) around the block."""

    def __init__(self, name: str):
        self.name = name
        self._range = None
        self._nvtx = False

    def __enter__(self):
        import torch

        self._range = torch.profiler.record_function(self.name)
        self._range.__enter__()
        try:
            torch.cuda.nvtx.range_push(self.name)
            self._nvtx = True
        except Exception:  # CPU-only torch builds have no NVTX
            self._nvtx = False
        return self

    def __exit__(self, *exc):
        import torch

        if self._nvtx:
            torch.cuda.nvtx.range_pop()
        self._range.__exit__(*exc)
        return False
