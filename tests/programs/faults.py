"""Faults the battery's programs inject from outside bprof, shared by them (each program imports it
from its own folder, which torchrun puts first on the import path)."""

from __future__ import annotations

import time

import torch


def busy(ms: float, name: str = "fault/slow_rank") -> None:
    """Compute for about `ms` milliseconds: real matmuls, so the profiler sees CPU ops, inside a
    named range so that tests can read how long the fault really ran (bprof does not use it)."""
    end = time.perf_counter() + ms / 1e3
    a = torch.randn(64, 64)
    with torch.profiler.record_function(name):
        while time.perf_counter() < end:
            a = torch.tanh(a @ a)
