"""bprof: where the time of a distributed training step goes, on every rank.

Importing bprof never imports torch; only bprof.profiler and bprof.replay do, and the helpers
below import it when first called.
"""

__version__ = "0.1.0"


def step() -> None:
    """End of a training iteration, for loops without an optimizer (see bprof.profiler.api)."""
    from bprof.profiler.api import step as _step

    _step()


def set_model_flops(model_flops_per_step: float, executed_flops_per_step: float | None = None, **extra) -> None:
    """Declare the model FLOPs per optimizer step (and executed FLOPs with recompute)."""
    from bprof.profiler.api import set_model_flops as _set

    _set(model_flops_per_step, executed_flops_per_step, **extra)


def annotate(name: str):
    """Context manager and decorator: an NVTX range and a profiler range named `name`."""
    from bprof.profiler.api import annotate as _annotate

    return _annotate(name)
