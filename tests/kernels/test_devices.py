"""Datasheet peaks: every device of the real traces and one hand-written deviceProperties per
catalogued device resolve to the right row; unknown or ambiguous devices resolve to None."""

from __future__ import annotations

import pytest

from bprof.kernels.devices import DTYPE_KEYS, device_rows, matmul_peak, normalize_dtype, resolve_device

from .traces import load_trace, shared_trace

GIB = 2**30

# folder -> the row every deviceProperties entry of that trace must resolve to
REAL = {
    "a100_ddp_nccl_rank0": "a100_sxm4_40gb",   # "NVIDIA A100-PG509-200": 40 GB SXM-class board
    "a100_ws16_rank0": "a100_sxm4_80gb",
    "mi250_rocm_minitoy": "mi250_gcd",         # "AMD Radeon Graphics", 104 CUs, 64 GiB: one MI250 die
    "v100_ns_resolution_rank0": "v100_sxm2",
    "v100_resnet50_legacy_2021": "v100_sxm2",  # "Tesla V100-DGXS-32GB"
}


@pytest.mark.parametrize("folder", sorted(REAL))
def test_real_trace_devices_resolve(folder):
    [path] = list(shared_trace(folder).iterdir())
    props = load_trace(path)["deviceProperties"]
    assert props
    for p in props:
        peaks = resolve_device(p)
        assert peaks is not None and peaks.device_id == REAL[folder], p
        assert p["name"] in peaks.matched_by


def test_cpu_only_trace_has_no_device():
    [path] = list(shared_trace("cpu_gloo_rank34").iterdir())
    assert load_trace(path).get("deviceProperties", []) == []


def props(name, major, minor, sms, mem_bytes, warp=32):
    return {"id": 0, "name": name, "totalGlobalMem": mem_bytes, "computeMajor": major, "computeMinor": minor,
            "numSms": sms, "warpSize": warp}


# one realistic deviceProperties per catalogued row (names as CUDA/HIP report them)
HAND = {
    "v100_sxm2": props("Tesla V100-SXM2-16GB", 7, 0, 80, 16945512448),
    "v100_pcie": props("Tesla V100-PCIE-32GB", 7, 0, 80, 34089730048),
    "a100_sxm4_40gb": props("NVIDIA A100-SXM4-40GB", 8, 0, 108, 42505273344),
    "a100_pcie_40gb": props("NVIDIA A100-PCIE-40GB", 8, 0, 108, 42505273344),
    "a100_sxm4_80gb": props("NVIDIA A100-SXM4-80GB", 8, 0, 108, 85198045184),
    "a100_pcie_80gb": props("NVIDIA A100 80GB PCIe", 8, 0, 108, 85094825984),
    "a800_sxm4_80gb": props("NVIDIA A800-SXM4-80GB", 8, 0, 108, 85198045184),
    "a800_pcie_80gb": props("NVIDIA A800 80GB PCIe", 8, 0, 108, 85198045184),
    "h100_sxm": props("NVIDIA H100 80GB HBM3", 9, 0, 132, 85045231616),
    "h100_pcie": props("NVIDIA H100 PCIe", 9, 0, 114, 85031714816),
    "h800_sxm": props("NVIDIA H800", 9, 0, 132, 85045231616),
    "h20": props("NVIDIA H20", 9, 0, 78, 102625181696),
    "h200_sxm": props("NVIDIA H200", 9, 0, 132, 150754820096),
    "b200": props("NVIDIA B200", 10, 0, 148, 191514083328),
    "mi250_package": props("AMD Instinct MI250", 9, 0, 208, 128 * GIB, warp=64),
    "mi250_gcd": props("AMD Radeon Graphics", 9, 0, 104, 68702699520, warp=64),
    "mi250x_package": props("AMD Instinct MI250X", 9, 0, 220, 128 * GIB, warp=64),
    "mi250x_gcd": props("AMD Instinct MI250X", 9, 0, 110, 68702699520, warp=64),
    "mi300x": props("AMD Instinct MI300X", 9, 4, 304, 205822885888, warp=64),
}


def test_every_row_has_a_hand_written_device():
    assert set(HAND) == {r.device_id for r in device_rows()}


@pytest.mark.parametrize("device_id", sorted(HAND))
def test_hand_written_device_resolves(device_id):
    peaks = resolve_device(HAND[device_id])
    assert peaks is not None and peaks.device_id == device_id
    assert peaks.mem_bytes_per_s > 0 and peaks.source and peaks.matched_by
    assert set(peaks.flops_per_s) <= set(DTYPE_KEYS) and "fp32" in peaks.flops_per_s


@pytest.mark.parametrize("p", [
    props("NVIDIA GeForce RTX 4090", 8, 9, 128, 25393692672),          # not in the table
    props("NVIDIA H100 NVL", 9, 0, 132, 100790943744),                 # H100 NVL 94 GB: not catalogued
    props("NVIDIA H800 PCIe", 9, 0, 114, 85031714816),                 # not H100 PCIe: no guess
    props("NVIDIA H200 NVL", 9, 0, 132, 150754820096),
    props("Tesla V100S-PCIE-32GB", 7, 0, 80, 34089730048),             # V100S: faster clocks, not catalogued
    props("AMD Instinct MI300X", 9, 4, 38, 205822885888 // 8, warp=64),  # CPX partition
    props("NVIDIA A100-SXM4-80GB", 8, 0, 98, 85198045184),             # SM count off (MIG or odd SKU)
    props("Mystery Accelerator", 9, 0, 132, 85045231616),              # vendor unknown, warpSize 32
])
def test_unknown_devices_are_not_guessed(p):
    assert resolve_device(p) is None


def test_vendor_from_warp_size_when_the_name_says_nothing():
    p = dict(HAND["mi250_gcd"], name="")
    assert resolve_device(p).device_id == "mi250_gcd"


@pytest.mark.parametrize("missing", ["computeMajor", "numSms", "totalGlobalMem"])
def test_missing_properties_give_none(missing):
    p = dict(HAND["h100_sxm"])
    del p[missing]
    assert resolve_device(p) is None


def test_no_name_resolves_to_two_rows():
    """Rows of one property range must have name patterns that no catalogued name matches twice."""
    for device_id, p in HAND.items():
        rows = [r for r in device_rows() if r.name_pattern is not None and r.name_pattern.search(p["name"])
                and r.compute == (p["computeMajor"], p["computeMinor"]) and r.sms[0] <= p["numSms"] <= r.sms[1]
                and r.mem_gib[0] <= p["totalGlobalMem"] / GIB <= r.mem_gib[1]]
        assert len(rows) <= 1, (device_id, [r.device_id for r in rows])


@pytest.mark.parametrize("package, gcd", [("mi250_package", "mi250_gcd"), ("mi250x_package", "mi250x_gcd")])
def test_one_gcd_is_half_a_package(package, gcd):
    whole, half = resolve_device(HAND[package]), resolve_device(HAND[gcd])
    assert half.flops_per_s == {k: v / 2 for k, v in whole.flops_per_s.items()}
    assert half.mem_bytes_per_s == whole.mem_bytes_per_s / 2


def test_datasheet_ratios_catch_typos():
    """Dense tensor peaks: bf16 = fp16 = 2 x tf32, fp8 = 2 x bf16 on every device that has them."""
    for r in device_rows():
        f = r.flops_per_s
        if "bf16" in f:
            assert f["bf16"] == f["fp16"], r.device_id
        if "tf32" in f:
            assert f["fp16"] == pytest.approx(2 * f["tf32"], rel=0.03), r.device_id
        if "fp8" in f:
            assert f["fp8"] == pytest.approx(2 * f["fp16"], rel=0.001), r.device_id
        assert f["fp16"] > f["fp32"], r.device_id


def test_known_values():
    h100 = resolve_device(HAND["h100_sxm"])
    assert h100.flops_per_s == {"bf16": 989.5e12, "fp16": 989.5e12, "fp8": 1979e12, "tf32": 494.5e12, "fp32": 67e12}
    assert h100.mem_bytes_per_s == 3.35e12
    a100 = resolve_device(HAND["a100_sxm4_40gb"])
    assert (a100.flops_per_s["bf16"], a100.mem_bytes_per_s) == (312e12, 1555e9)
    v100 = resolve_device(HAND["v100_sxm2"])
    assert v100.flops_per_s == {"fp16": 125e12, "fp32": 15.7e12}  # no bf16, fp8 or tf32 on Volta


def test_matmul_peak_texts_say_which_peak():
    h100 = resolve_device(HAND["h100_sxm"])
    flops, text = matmul_peak(h100, "float")
    assert flops == 67e12 and "non-tensor" in text and "TF32" in text
    assert matmul_peak(h100, "c10::BFloat16") == (989.5e12, "dense BF16 tensor-core peak")
    flops, text = matmul_peak(h100, "c10::Float8_e4m3fn")
    assert flops == 1979e12 and "FP8" in text
    assert matmul_peak(h100, "tf32")[0] == 494.5e12
    assert matmul_peak(h100, "double") is None and matmul_peak(h100, "long int") is None
    v100 = resolve_device(HAND["v100_sxm2"])
    assert matmul_peak(v100, "BFloat16") is None and matmul_peak(v100, "c10::Half")[0] == 125e12
    flops, text = matmul_peak(resolve_device(HAND["mi250_gcd"]), "float")
    assert flops == 45.25e12 and "matrix-core" in text


@pytest.mark.parametrize("traced, short", [
    ("c10::BFloat16", "bf16"), ("BFloat16", "bf16"), ("bf16", "bf16"), ("torch.bfloat16", "bf16"),
    ("float", "fp32"), ("Float", "fp32"), ("torch.float32", "fp32"),
    ("c10::Half", "fp16"), ("Half", "fp16"), ("float16", "fp16"),
    ("double", "fp64"), ("Double", "fp64"),
    ("float8_e4m3fn", "fp8"), ("c10::Float8_e4m3fn", "fp8"), ("c10::Float8_e5m2", "fp8"), ("Float8_e4m3fnuz", "fp8"),
    ("signed char", "int8"), ("Char", "int8"), ("int8", "int8"),
    ("", None), ("Scalar", None), ("long int", None), ("unsigned char", None), ("GenericList", None), (None, None),
])
def test_normalize_dtype(traced, short):
    assert normalize_dtype(traced) == short
