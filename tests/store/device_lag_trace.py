"""A minimal trace of the MI300X case of issue 21 item 5: the host runs ahead of the device.

Three ProfilerStep ranges of 16.8, 16.0 and 15.9 ms launch (hipLaunchKernel, the ROCm runtime)
56.5 ms of kernels that run back to back; the device was still busy with work launched before the
window, so the last kernel ends 38 ms after the last CPU step. `write_device_lag_trace` writes the
gzip Kineto JSON and returns what it wrote (the CPU ranges and the kernels), from which the tests
compute their expectations without bprof.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

BASE_NS = 1790857026000000000
T0_US = 5110314061641.0  # relative float us, as torch >= 2.4 writes them
CPU_STEPS_MS = (16.8, 16.0, 15.9)
DEVICE_STEPS_MS = (18.9, 18.8, 18.8)  # 56.5 ms in all
LAG_AFTER_LAST_MS = 38.0  # the last kernel ends this long after the last CPU step
PID, TID, DEVICE = 4242, 4242, 0
GEMM = "Cijk_Alik_Bljk_BBS_BH_MT256x256x64_MI32x32x8x1_SN_1LDSB1_AFC1_AFEM1_GRVW8_GSU1_ISA942_K1_LBSPPA128_MIWT4_4"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
ADAM = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, float, float, float, float, float, float, bool, float*, float*>(at::native::(anonymous namespace)::TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>, float*, float, float, float, float, float, float, bool, float*, float*)"
# (name, phase, share of the step's device work): 4 forward GEMMs, 4 backward, an add, the optimizer
KERNELS = [(GEMM, "forward", 0.11)] * 4 + [(GEMM, "backward", 0.11)] * 4 + [(ELEMENTWISE, "backward", 0.05),
                                                                            (ADAM, "optimizer", 0.07)]


@dataclass(frozen=True)
class Written:
    """What the file holds, in ns on the trace's clock (base time included)."""

    cpu_steps: list[tuple[int, int, int]]  # (step, ts_ns, dur_ns) of each ProfilerStep range
    kernels: list[tuple[int | None, int, int]]  # (launching step or None, ts_ns, dur_ns) of each kernel
    launches: dict[int, list[int]]  # step -> ts_ns of its kernel launches, in order


def _ns(us: float) -> int:
    return BASE_NS + int(round(us * 1000))


def write_device_lag_trace(path: Path, device_steps_ms=DEVICE_STEPS_MS, pre_window: bool = True) -> Written:
    """Write the trace to `path` (gzip JSON); return its step ranges and kernels. A kernel starts
    when the device is free, and never before its launch; `device_steps_ms` of less work than the
    CPU steps (and pre_window=False) gives the opposite case, a device starved by its host."""
    events: list[dict] = []
    cpu_steps, kernels, launches = [], [], {}
    corr = 1000
    # work launched before the window (a step the profiler did not keep) keeps the device busy
    pre_end_us = T0_US + sum(CPU_STEPS_MS) * 1000 + LAG_AFTER_LAST_MS * 1000 - sum(DEVICE_STEPS_MS) * 1000
    if not pre_window:
        pre_end_us = T0_US - 100
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": PID, "tid": TID,
                   "ts": round(T0_US - 600, 3), "dur": 8.0, "args": {"correlation": corr, "stream": "0x0"}})
    events.append({"ph": "X", "cat": "kernel", "name": GEMM, "pid": DEVICE, "tid": 0, "ts": round(T0_US - 500, 3),
                   "dur": round(pre_end_us - (T0_US - 500), 3),
                   "args": {"device": DEVICE, "stream": 0, "correlation": corr, "kind": "Dispatch Kernel"}})
    kernels.append((None, _ns(T0_US - 500), _ns(pre_end_us) - _ns(T0_US - 500)))
    cpu_t, dev_t = T0_US, pre_end_us
    for i, (cpu_ms, dev_ms) in enumerate(zip(CPU_STEPS_MS, device_steps_ms)):
        step = i + 1
        cpu_us = cpu_ms * 1000
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": PID, "tid": TID,
                       "ts": round(cpu_t, 3), "dur": round(cpu_us, 3), "args": {"External id": step * 100}})
        cpu_steps.append((step, _ns(cpu_t), _ns(cpu_t + cpu_us) - _ns(cpu_t)))
        # the host's ops, evenly over the step; each launches one kernel
        slot = cpu_us / (len(KERNELS) + 2)
        opt_start = cpu_t + slot * (len(KERNELS) - 0.5)
        events.append({"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "pid": PID, "tid": TID,
                       "ts": round(opt_start, 3), "dur": round(slot * 1.5, 3), "args": {"External id": step * 100 + 99}})
        for k, (name, phase, share) in enumerate(KERNELS):
            corr += 1
            op_ts = cpu_t + slot * (k + 1)
            op = {"forward": "aten::mm", "backward": "aten::mm", "optimizer": "aten::_fused_adamw_"}[phase]
            if name == ELEMENTWISE:
                op = "aten::add_"
            if phase == "backward":
                events.append({"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: MmBackward0",
                               "pid": PID, "tid": TID, "ts": round(op_ts - 5, 3), "dur": round(slot * 0.6 + 10, 3),
                               "args": {"External id": corr * 10 + 1}})
            dims = {"aten::mm": [[4096, 4096], [4096, 4096]], "aten::add_": [[4096, 4096], [4096, 4096], []],
                    "aten::_fused_adamw_": [[], [], [], [], []]}[op]
            events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": PID, "tid": TID, "ts": round(op_ts, 3),
                           "dur": round(slot * 0.6, 3),
                           "args": {"External id": corr * 10, "Input Dims": dims,
                                    "Input type": ["c10::BFloat16"] * len(dims)}})
            launch_us = op_ts + slot * 0.2
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "hipLaunchKernel", "pid": PID, "tid": TID,
                           "ts": round(launch_us, 3), "dur": 6.0,
                           "args": {"External id": corr * 10, "correlation": corr, "stream": "0x0"}})
            dur_us = dev_ms * 1000 * share
            dev_t = max(dev_t, launch_us + 10)
            launches.setdefault(step, []).append(_ns(launch_us))
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": DEVICE, "tid": 0, "ts": round(dev_t, 3),
                           "dur": round(dur_us, 3),
                           "args": {"External id": corr * 10, "device": DEVICE, "stream": 0, "correlation": corr,
                                    "kind": "Dispatch Kernel"}})
            kernels.append((step, _ns(dev_t), _ns(dev_t + dur_us) - _ns(dev_t)))
            dev_t += dur_us
        cpu_t += cpu_us
    events.append({"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "python3"}})
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": DEVICE, "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992,
                              "computeMajor": 9, "computeMinor": 4, "numSms": 304, "warpSize": 64}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                           "pg_size": 1, "ranks": [0]}]},
        "traceEvents": events,
        "traceName": "mi300x_device_lag",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    return Written(cpu_steps, kernels, launches)
