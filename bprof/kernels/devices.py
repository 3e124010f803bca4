"""Dense datasheet peaks (FLOP/s per dtype, memory and intra-host link bytes/s) of a traced device, from devices.csv.

A device is matched by its Kineto deviceProperties (vendor, compute capability, SM/CU count and
memory), the name breaking ties between boards of one chip; no match means None, never a guess.
"""

from __future__ import annotations

import csv
import functools
import io
import re
from dataclasses import dataclass
from importlib import resources

DTYPE_KEYS: tuple[str, ...] = ("bf16", "fp16", "fp8", "tf32", "fp32")

# Unit trap: mem_gb_min/max in devices.csv are GiB (2**30 bytes) of totalGlobalMem, which is
# below the marketed size (an "80GB" A100 reports 79.2 GiB, a "40GB" one 39.4 GiB).
_GIB = 2**30

_NVIDIA_NAME = re.compile(r"(?i)\b(nvidia|tesla|quadro|geforce)\b")
_AMD_NAME = re.compile(r"(?i)\b(amd|radeon|instinct)\b")


@dataclass(frozen=True)
class DevicePeaks:
    device_id: str
    flops_per_s: dict[str, float]  # dense peak per dtype key ('bf16','fp16','fp8','tf32','fp32'): supported ones only
    mem_bytes_per_s: float
    source: str
    matched_by: str  # which properties matched, in words
    link_bytes_per_s: float | None = None  # intra-host link (NVLink) per direction per GPU; None: not in the table


@dataclass(frozen=True)
class _Row:
    device_id: str
    vendor: str
    name_pattern: re.Pattern[str] | None
    compute: tuple[int, int]
    sms: tuple[int, int]
    mem_gib: tuple[float, float]
    flops_per_s: dict[str, float]
    mem_bytes_per_s: float
    link_bytes_per_s: float | None
    source: str


@functools.cache
def device_rows() -> tuple[_Row, ...]:
    """devices.csv, parsed once."""
    text = resources.files("bprof.kernels").joinpath("devices.csv").read_text(encoding="utf-8")
    rows = []
    for r in csv.DictReader(io.StringIO(text)):
        rows.append(_Row(
            device_id=r["device_id"], vendor=r["vendor"],
            name_pattern=re.compile(r["name_pattern"], re.IGNORECASE) if r["name_pattern"] else None,
            compute=(int(r["compute_major"]), int(r["compute_minor"])),
            sms=(int(r["sm_count_min"]), int(r["sm_count_max"])),
            mem_gib=(float(r["mem_gb_min"]), float(r["mem_gb_max"])),
            flops_per_s={k: float(r[f"{k}_flops_per_s"]) for k in DTYPE_KEYS if r[f"{k}_flops_per_s"]},
            mem_bytes_per_s=float(r["mem_bytes_per_s"]),
            link_bytes_per_s=float(r["link_bytes_per_s"]) if r["link_bytes_per_s"] else None, source=r["source"]))
    return tuple(rows)


def infer_vendor(props: dict) -> str | None:
    """'nvidia' or 'amd' from the device name, else 'amd' when warpSize is 64; None when unsure."""
    name = str(props.get("name") or "")
    if _NVIDIA_NAME.search(name):
        return "nvidia"
    if _AMD_NAME.search(name):
        return "amd"
    if props.get("warpSize") == 64:
        return "amd"
    return None


def resolve_device(props: dict) -> DevicePeaks | None:
    """Peaks of the device one Kineto deviceProperties entry describes; None when unknown or ambiguous."""
    vendor = infer_vendor(props)
    try:
        compute = (int(props["computeMajor"]), int(props["computeMinor"]))
        sms = int(props["numSms"])
        mem_gib = int(props["totalGlobalMem"]) / _GIB
    except (KeyError, TypeError, ValueError):
        return None
    if vendor is None:
        return None
    name = str(props.get("name") or "")
    found = [r for r in device_rows()
             if r.vendor == vendor and r.compute == compute and r.sms[0] <= sms <= r.sms[1]
             and r.mem_gib[0] <= mem_gib <= r.mem_gib[1]]
    named = [r for r in found if r.name_pattern is not None and r.name_pattern.search(name)]
    unnamed = [r for r in found if r.name_pattern is None]
    if len(named) == 1:
        row, how = named[0], f"name {name!r} matches /{named[0].name_pattern.pattern}/"
    elif not named and len(unnamed) == 1:
        row, how = unnamed[0], f"name {name!r} not needed"
    else:
        return None
    matched_by = (f"{vendor}, compute {compute[0]}.{compute[1]}, {sms} {'CUs' if vendor == 'amd' else 'SMs'}, "
                  f"{mem_gib:.1f} GiB; {how}")
    return DevicePeaks(row.device_id, dict(row.flops_per_s), row.mem_bytes_per_s, row.source, matched_by,
                       row.link_bytes_per_s)


def normalize_dtype(traced: str) -> str | None:
    """'bf16','fp16','fp32','fp64','fp8','int8' (or 'tf32' if asked by that name) from a traced dtype; None if unknown."""
    key = str(traced or "").strip().lower()
    for prefix in ("c10::", "torch.", "at::"):
        if key.startswith(prefix):
            key = key[len(prefix):]
    return _DTYPES.get(key)


_DTYPES = {
    **dict.fromkeys(("bfloat16", "bf16", "__nv_bfloat16", "hip_bfloat16"), "bf16"),
    **dict.fromkeys(("half", "float16", "fp16", "f16", "__half"), "fp16"),
    **dict.fromkeys(("float", "float32", "fp32", "f32"), "fp32"),
    **dict.fromkeys(("double", "float64", "fp64", "f64"), "fp64"),
    **dict.fromkeys(("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "fp8", "e4m3", "e5m2",
                     "fp8_e4m3", "fp8_e5m2", "__nv_fp8_e4m3", "__nv_fp8_e5m2"), "fp8"),
    **dict.fromkeys(("int8", "char", "signed char", "qint8"), "int8"),
    "tf32": "tf32",
}

_UNIT = {"nvidia": "tensor-core", "amd": "matrix-core"}


def matmul_peak(peaks: DevicePeaks, dtype: str) -> tuple[float, str] | None:
    """(dense FLOP/s, which peak in words) for a matmul whose operands have this traced dtype."""
    key = normalize_dtype(dtype)
    if key is None or key not in peaks.flops_per_s:
        return None
    flops = peaks.flops_per_s[key]
    vendor = next((r.vendor for r in device_rows() if r.device_id == peaks.device_id), "nvidia")
    unit = _UNIT[vendor]
    if key == "fp32":
        if unit == "matrix-core":
            return flops, "FP32 matrix-core (MFMA) peak: rocBLAS runs fp32 GEMMs on the matrix cores"
        tf32 = peaks.flops_per_s.get("tf32")
        also = f"; the TF32 tensor-core peak, {tf32 / 1e12:g} TFLOP/s, applies only if TF32 was allowed" if tf32 else ""
        return flops, f"FP32 non-tensor (CUDA-core) peak, fp32 matmul without TF32{also}"
    if key == "fp8":
        return flops, f"dense FP8 {unit} peak (the operands are fp8)"
    return flops, f"dense {key.upper()} {unit} peak"
