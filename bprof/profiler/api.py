"""What a training script may call (all optional): explicit steps, annotations, declared FLOPs.

Each works whether or not the process runs under `bprof record`; outside it they do nothing
beyond the torch ranges they emit.
"""

from __future__ import annotations

import contextlib

from bprof.profiler import nvtx_ranges, rank_hook


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
    """`with bprof.annotate("name"):` or `@bprof.annotate("name")`: a profiler range (the Kineto
    trace, which bprof's analysis reads) and an NVTX range (Nsight Systems) around the block.

    The NVTX range goes through the `nvtx` package where it is installed (domain "bprof", one
    colour per kind of range: the name up to its first "/"), else torch.cuda.nvtx where CUDA is
    available, else nowhere (see bprof.profiler.nvtx_ranges)."""

    def __init__(self, name: str):
        self.name = name
        self._range = None
        self._nvtx_backend = None

    def _recreate_cm(self):
        # as a decorator, each call gets its own ranges: recursion and threads do not share them
        return annotate(self.name)

    def __enter__(self):
        import torch

        self._range = torch.profiler.record_function(self.name)
        self._range.__enter__()
        self._nvtx_backend = nvtx_ranges.push(self.name)
        return self

    def __exit__(self, *exc):
        nvtx_ranges.pop(self._nvtx_backend)
        self._range.__exit__(*exc)
        return False
