"""Measure this machine's dense matmul FLOP/s and copy bandwidth (what `bprof calibrate` stores).

torch is imported inside the functions: importing this module needs no torch.
"""

from __future__ import annotations

import contextlib
import math
import platform
import socket
import statistics
import time
from datetime import datetime, timezone
from typing import Callable, Sequence

from bprof.errors import DeviceError, UsageError
from bprof.store.peaks import MeasuredPeak

# short name -> torch dtype attribute; tf32 is fp32 tensors with TF32 tensor-core math allowed
TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
DEFAULT_DTYPES = {"cpu": ("fp32", "bf16"), "cuda": ("fp32", "tf32", "bf16", "fp16")}
# n of the n x n x n matmul: on a 2-core CPU one bf16 matmul of n=1024 takes ~65 ms, fp32 ~10 ms
DEFAULT_SIZE = {"cpu": 1024, "cuda": 8192}
# bytes of the tensor copy_ reads (and writes again): far beyond the last-level cache
DEFAULT_COPY_BYTES = {"cpu": 128 * 2**20, "cuda": 256 * 2**20}
_MAX_GROWTH = 100


def normalise_dtype(name: str) -> str:
    """fp32, tf32, bf16 or fp16 from a short or torch-style name (bfloat16, half, ...)."""
    short = _ALIASES.get(name.strip().lower(), name.strip().lower())
    if short not in TORCH_DTYPES:
        raise UsageError(f"unknown dtype {name!r} (one of {', '.join(TORCH_DTYPES)})")
    return short


def calibrate(device: str = "cpu", dtypes: Sequence[str] | None = None, num_threads: int | None = None,
              size: int | None = None, repeats: int = 5, min_time_s: float = 0.2,
              copy_bytes: int | None = None, progress: Callable[[str], None] | None = None) -> list[MeasuredPeak]:
    """Measure `device` (cpu, cuda, cuda:N): one MeasuredPeak per dtype, best of `repeats` timed batches.

    Each batch repeats torch.mm on n x n matrices (2 n^3 FLOPs each) often enough to last at least
    `min_time_s` (the count is found by a warm-up that doubles it). Copy bandwidth is timed the same
    way once per call and shown on every row. `dtypes` defaults to DEFAULT_DTYPES of the device;
    `num_threads` sets torch's intra-op threads for the measurement and is restored afterwards.
    """
    torch = _import_torch()
    dev = _device(torch, device)
    kind = dev.type
    names = list(dict.fromkeys(normalise_dtype(d) for d in (dtypes or DEFAULT_DTYPES[kind])))
    if kind == "cpu" and "tf32" in names:
        raise UsageError("tf32 is a CUDA matmul mode; on cpu measure fp32")
    n = DEFAULT_SIZE[kind] if size is None else size
    copy_bytes = DEFAULT_COPY_BYTES[kind] if copy_bytes is None else copy_bytes
    for label, value in (("size", n), ("repeats", repeats), ("num_threads", num_threads), ("copy_bytes", copy_bytes)):
        if value is not None and value < 1:
            raise UsageError(f"{label} must be at least 1, not {value}")
    if not min_time_s > 0:
        raise UsageError(f"min_time_s must be positive, not {min_time_s}")
    say = progress or (lambda message: None)

    previous_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        with torch.cuda.device(dev) if kind == "cuda" else contextlib.nullcontext():
            threads = torch.get_num_threads()
            device_name = torch.cuda.get_device_name(dev) if kind == "cuda" else _cpu_model_name()
            say(f"copy bandwidth, {copy_bytes / 2**20:.0f} MiB on {device_name}")
            mem_bytes_per_s = max(_copy_bytes_per_s(torch, dev, copy_bytes, repeats, min_time_s))
            peaks = []
            for name in names:
                say(f"{name} matmul, n={n}, {threads} threads, {repeats} repeats")
                rates = _matmul_flops_per_s(torch, dev, name, n, repeats, min_time_s)
                peaks.append(MeasuredPeak(
                    host=socket.gethostname(), device_kind=kind, device_name=device_name, dtype=name,
                    num_threads=threads, flops_per_s=max(rates), flops_per_s_spread_frac=spread_frac(rates),
                    mem_bytes_per_s=mem_bytes_per_s, matmul_size=n, num_repeats=repeats,
                    measured_at=datetime.now(timezone.utc), torch_version=torch.__version__))
    finally:
        torch.set_num_threads(previous_threads)
    return peaks


def spread_frac(values: Sequence[float]) -> float | None:
    """(max - min) / median; None for fewer than two values (one repeat has no spread)."""
    if len(values) < 2:
        return None
    return (max(values) - min(values)) / statistics.median(values)


def _matmul_flops_per_s(torch, dev, name: str, n: int, repeats: int, min_time_s: float) -> list[float]:
    dtype = getattr(torch, TORCH_DTYPES[name])
    generator = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, dtype=dtype, device=dev, generator=generator)
    b = torch.randn(n, n, dtype=dtype, device=dev, generator=generator)
    c = torch.empty(n, n, dtype=dtype, device=dev)
    # fp32 on cuda is measured without TF32 whatever the caller set; tf32 with it
    with _allow_tf32(torch, name == "tf32") if dev.type == "cuda" else contextlib.nullcontext():
        calls, seconds = _timed_batches(torch, dev, lambda: torch.mm(a, b, out=c), repeats, min_time_s)
    return [2 * n**3 * calls / s for s in seconds]


def _copy_bytes_per_s(torch, dev, copy_bytes: int, repeats: int, min_time_s: float) -> list[float]:
    src = torch.ones(copy_bytes // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    calls, seconds = _timed_batches(torch, dev, lambda: dst.copy_(src), repeats, min_time_s)
    moved = 2 * src.numel() * src.element_size()  # read once, written once
    return [moved * calls / s for s in seconds]


def _timed_batches(torch, dev, fn: Callable[[], object], repeats: int, min_time_s: float) -> tuple[int, list[float]]:
    """(calls per batch, seconds of each of `repeats` batches); the warm-up grows the batch to >= min_time_s."""
    _time_batch(torch, dev, fn, 1)  # first call: allocation, kernel choice, page faults
    calls = 1
    while (elapsed := _time_batch(torch, dev, fn, calls)) < min_time_s:
        growth = min(_MAX_GROWTH, 1.2 * min_time_s / elapsed) if elapsed > 0 else _MAX_GROWTH
        calls = max(calls * 2, math.ceil(calls * growth))
    return calls, [_time_batch(torch, dev, fn, calls) for _ in range(repeats)]


def _time_batch(torch, dev, fn: Callable[[], object], calls: int) -> float:
    if dev.type == "cuda":
        # CUDA events time the device's work; the host only queues it
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return time.perf_counter() - t0


@contextlib.contextmanager
def _allow_tf32(torch, allowed: bool):
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _device(torch, device: str):
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise UsageError(f"unknown device {device!r} (cpu, cuda or cuda:N)") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise UsageError(f"cannot calibrate device {device!r} (cpu, cuda or cuda:N)")
    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
        raise DeviceError(f"device {device!r}: CUDA is not available (torch {torch.__version__}, {build})")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise DeviceError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    return value.strip()
    except OSError:
        pass
    # no /proc/cpuinfo (macOS) or no model name line (many ARM kernels)
    return platform.processor() or platform.machine() or "unknown cpu"


def _import_torch():
    try:
        import torch
    except ImportError:
        raise UsageError("calibration needs torch: pip install 'bprof[capture]'") from None
    return torch
