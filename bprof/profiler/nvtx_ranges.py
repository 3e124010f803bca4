"""NVTX ranges for `bprof.annotate` (what Nsight Systems shows), through the best emitter here.

Chosen once per process by `backend()`:
- "nvtx": NVIDIA's `nvtx` package (`pip install 'bprof[capture]'`), in the "bprof" domain with one
  colour per kind of range. It needs no CUDA: without a tool attached (Nsight Systems sets
  NVTX_INJECTION64_PATH) each call returns at once and records nothing.
- "torch.cuda.nvtx": torch's own binding, where the package is missing and CUDA is available
  (no domain or colour: the default domain).
- None: neither; bprof.annotate then emits only its profiler range (the Kineto trace).

The profiler range is bprof.annotate's own business (the analysis reads it from the trace); this
module only adds the NVTX range beside it.
"""

from __future__ import annotations

import functools
import zlib
from typing import Optional

DOMAIN = "bprof"

# ARGB; the kind of a range is its name up to the first "/" ("fwd/attn" and "fwd/mlp" share one).
# Integers, not colour names: the nvtx package resolves names other than its own few through
# matplotlib, which bprof does not require.
PALETTE_ARGB = (0xFF1F77B4, 0xFFFF7F0E, 0xFF2CA02C, 0xFFD62728, 0xFF9467BD,
                0xFF8C564B, 0xFFE377C2, 0xFF7F7F7F, 0xFFBCBD22, 0xFF17BECF)


def kind_of(name: str) -> str:
    """The kind of a range: its name up to the first "/" (the whole name when it has none)."""
    return name.split("/", 1)[0]


def color_argb(name: str) -> int:
    """The colour of the range `name`: one per kind, the same in every process and run."""
    return PALETTE_ARGB[zlib.crc32(kind_of(name).encode()) % len(PALETTE_ARGB)]


@functools.lru_cache(maxsize=1)
def backend() -> Optional[str]:
    """"nvtx", "torch.cuda.nvtx" or None (see the module docstring); looked up once, as a failed
    import costs tens of microseconds each time."""
    try:
        import nvtx  # noqa: F401
        return "nvtx"
    except ImportError:
        pass
    try:
        import torch
    except ImportError:
        return None
    return "torch.cuda.nvtx" if torch.cuda.is_available() else None


def push(name: str) -> Optional[str]:
    """Open the NVTX range `name`; returns the backend that must close it (None: nothing opened)."""
    used = backend()
    if used == "nvtx":
        import nvtx

        nvtx.push_range(name, color=color_argb(name), domain=DOMAIN)
    elif used == "torch.cuda.nvtx":
        import torch

        torch.cuda.nvtx.range_push(name)
    return used


def pop(used: Optional[str]) -> None:
    """Close the innermost range that `push` opened through backend `used`."""
    if used == "nvtx":
        import nvtx

        nvtx.pop_range(domain=DOMAIN)
    elif used == "torch.cuda.nvtx":
        import torch

        torch.cuda.nvtx.range_pop()
