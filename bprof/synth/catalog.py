"""Names and numbers the synthetic traces borrow from real ones: kernel names, launch shapes,
device properties, NCCL kernel naming per era, and a simple cost model for durations.

Kernel names are copied in style from real A100/H100 traces (cuBLAS sm80/sm90 xmma, ampere
s16816gemm, at::native elementwise/layer-norm kernels, pytorch_flash, multi_tensor_apply).
"""

from __future__ import annotations

# --- devices ------------------------------------------------------------------------------------

DEVICE_PROPS = {
    "A100": {"name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 84990623744,
             "computeMajor": 8, "computeMinor": 0, "maxThreadsPerBlock": 1024,
             "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
             "sharedMemPerBlock": 49152, "numSms": 108, "regsPerMultiprocessor": 65536,
             "sharedMemPerBlockOptin": 166912, "sharedMemPerMultiprocessor": 167936},
    "H100": {"name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85045231616,
             "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
             "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
             "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
             "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472},
}

# Dense 16-bit tensor peak (FLOP/s), HBM bandwidth (bytes/s), intra-host (NVLink) and inter-host
# (one 200/400 Gb/s NIC per GPU) bus bandwidth in bytes/s; H100 also its dense FP8 peak (datasheet,
# SXM). Only used to make durations plausible.
DEVICE_PERF = {
    "A100": {"flops": 312e12, "hbm": 2.0e12, "nvlink": 230e9, "net": 24e9},
    "H100": {"flops": 989e12, "fp8_flops": 1979e12, "hbm": 3.35e12, "nvlink": 370e9, "net": 48e9},
}

GEMM_EFF = 0.62
ATTN_EFF = 0.45
MEM_EFF = 0.72


def gemm_ns(device: str, flops: float, eff: float = GEMM_EFF, peak: str = "flops") -> int:
    """Duration of `flops` at `eff` of a DEVICE_PERF peak ("flops": 16-bit, "fp8_flops")."""
    return max(3_000, int(flops / (DEVICE_PERF[device][peak] * eff) * 1e9))


def mem_ns(device: str, nbytes: float) -> int:
    return max(2_000, int(nbytes / (DEVICE_PERF[device]["hbm"] * MEM_EFF) * 1e9))


def comm_ns(device: str, op: str, nbytes: int, group_size: int, inter_host: bool) -> int:
    """Transfer time once the last member arrived: latency + nccl-tests busbw formulas."""
    bw = DEVICE_PERF[device]["net" if inter_host else "nvlink"]
    n = group_size
    if op == "allreduce":
        moved = 2 * (n - 1) / n * nbytes
    elif op in ("allgather", "reduce_scatter"):
        moved = (n - 1) / n * nbytes
    else:  # broadcast, send, recv
        moved = nbytes
    latency = 18_000 if inter_host else 9_000
    return latency + int(moved / bw * 1e9)


# --- dtypes -------------------------------------------------------------------------------------

ELEM_BYTES = {"BFloat16": 2, "Half": 2, "Float": 4, "Long": 8, "Byte": 1, "Float8_e4m3fn": 1}
# Activation dtype per compute dtype (record_param_comms `dtype`): fp8 runs keep bf16 activations
# and cast only the GEMM operands.
TORCH_DTYPE = {"bf16": "BFloat16", "fp16": "Half", "fp8": "BFloat16"}
INPUT_TYPE = {"BFloat16": "c10::BFloat16", "Half": "c10::Half", "Float": "float",
              "Long": "long int", "Byte": "unsigned char",
              "Float8_e4m3fn": "c10::Float8_e4m3fn"}  # cpu_op `Input type` (caffe2 TypeMeta name)
C10 = {"bf16": "c10::BFloat16", "fp16": "c10::Half", "fp8": "c10::BFloat16"}
CUTLASS = {"bf16": "cutlass::bfloat16_t", "fp16": "cutlass::half_t", "fp8": "cutlass::bfloat16_t"}

# --- NCCL kernel names --------------------------------------------------------------------------

_NCCL_OP = {"allreduce": "AllReduce", "allgather": "AllGather", "reduce_scatter": "ReduceScatter",
            "broadcast": "Broadcast", "send": "SendRecv", "recv": "SendRecv"}
_NCCL_DT_NEW = {"BFloat16": "bf16", "Half": "f16", "Float": "f32", "Long": "i64"}
_NCCL_DT_OLD = {"BFloat16": "bf16", "Half": "half", "Float": "float", "Long": "int64_t"}


def nccl_kernel_name(fmt: str, op: str, dtype: str, nbytes: int) -> str:
    """NCCL >= 2.19 `ncclDevKernel_*` names (modern) or NCCL 2.1x `ncclKernel_*` (2022)."""
    proto = "LL" if nbytes < 64 * 1024 else ("LL128" if nbytes < 4 << 20 else "SIMPLE")
    kop = _NCCL_OP[op]
    if fmt == "modern":
        if kop == "SendRecv":
            return "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
        if kop in ("AllGather", "Broadcast"):
            return f"ncclDevKernel_{kop}_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)"
        return f"ncclDevKernel_{kop}_Sum_{_NCCL_DT_NEW[dtype]}_RING_{proto}" \
               "(ncclDevKernelArgsStorage<4096ul>)"
    if kop in ("SendRecv", "AllGather", "Broadcast"):
        return f"ncclKernel_{kop}_RING_{'SIMPLE' if kop == 'SendRecv' else proto}_Sum_int8_t" \
               "(ncclWorkElem)"
    return f"ncclKernel_{kop}_RING_{proto}_Sum_{_NCCL_DT_OLD[dtype]}(ncclWorkElem)"


# --- compute kernel names and launch shapes -----------------------------------------------------

def _gemm_names(device: str, dt: str) -> dict[str, str]:
    if dt == "fp8":  # cuBLASLt fp8 GEMMs on Hopper take only the TN layout: e4m3 in, bf16 out
        x = "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize"
        tail = "_execute_segment_k_off_kernel__5x_cublas"
        return {
            "fwd": f"{x}128x128x128_warpgroupsize1x1x1{tail}",
            "fwd2": f"{x}128x256x128_warpgroupsize2x1x1{tail}",
            "dgrad": f"{x}256x128x128_warpgroupsize2x1x1{tail}",
            "wgrad": f"{x}128x128x128_warpgroupsize1x1x1{tail}",
        }
    if device == "H100":
        x = "bf16bf16_bf16f32_f32" if dt == "bf16" else "f16f16_f16f32_f32"
        return {
            "fwd": f"sm90_xmma_gemm_{x}_tn_n_tilesize128x256x64_warpgroupsize2x1x1_"
                   "execute_segment_k_off_kernel__5x_cublas",
            "fwd2": "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT",
            "dgrad": "nvjet_tst_256x128_64x4_1x2_h_bz_coopB_NNT",
            "wgrad": f"sm90_xmma_gemm_{x}_nt_n_tilesize128x128x64_warpgroupsize1x1x1_"
                     "execute_segment_k_off_kernel__5x_cublas",
        }
    x = "bf16bf16_bf16f32_f32" if dt == "bf16" else "f16f16_f16f32_f32"
    a = "bf16" if dt == "bf16" else "fp16"
    return {
        "fwd": f"sm80_xmma_gemm_{x}_tn_n_tilesize128x128x32_stage4_warpsize2x2x1_"
               "tensor16x8x16_kernel",
        "fwd2": f"ampere_{a}_s16816gemm_{a}_128x128_ldg8_f2f_stages_64x3_tn",
        "dgrad": f"ampere_{a}_s16816gemm_{a}_128x128_ldg8_f2f_stages_64x3_nn",
        "wgrad": f"sm80_xmma_gemm_{x}_nt_n_tilesize128x128x32_stage4_warpsize2x2x1_"
                 "tensor16x8x16_kernel",
    }


# TransformerEngine's bf16 -> fp8 e4m3 cast (transformer_engine/common/util/cast_kernels.cuh).
FP8_CAST = ("void transformer_engine::cast_fp8_2D_kernel<false, false, transformer_engine::Empty, "
            "&(float transformer_engine::identity<float>(float, transformer_engine::Empty const&)), "
            "__nv_bfloat16, __nv_fp8_e4m3>(CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap, "
            "float const*, float*, float*, float const*, unsigned long, unsigned long)")


def kernel_names(device: str, dt: str) -> dict[str, str]:
    """Kernel name per role for one device and compute dtype ("bf16" | "fp16" | "fp8": fp8
    GEMMs and casts, every other kernel bf16)."""
    c, cu = C10[dt], CUTLASS[dt]
    ew = "void at::native::vectorized_elementwise_kernel<4, "
    gelu = ("at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)"
            "::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
            f"{{lambda({c})#1}}")
    gelu_b = ("at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, "
              "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
              f"operator()() const::{{lambda({c}, {c})#1}}")
    names = _gemm_names(device, dt)
    if dt == "fp8":
        names["fp8_cast"] = FP8_CAST
    names.update({
        "ln_fwd": "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel"
                  f"<{c}, float>(int, float, {c} const*, {c} const*, {c} const*, float*, "
                  f"float*, {c}*)",
        "ln_bwd": "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_"
                  f"vectorized<{c}, float>({c} const*, {c} const*, float const*, float const*, "
                  f"{c} const*, {c}*, int)",
        "ln_bwd_gb": "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32"
                     f"<{c}, float>(long, long, {c} const*, {c} const*, float const*, "
                     f"float const*, {c}*, {c}*)",
        "gelu": f"{ew}{gelu}, at::detail::Array<char*, 2> >(int, {gelu}, "
                "at::detail::Array<char*, 2>)",
        "gelu_bwd": f"{ew}{gelu_b}, at::detail::Array<char*, 3> >(int, {gelu_b}, "
                    "at::detail::Array<char*, 3>)",
        "add": f"{ew}at::native::CUDAFunctor_add<{c}>, at::detail::Array<char*, 3> >(int, "
               f"at::native::CUDAFunctor_add<{c}>, at::detail::Array<char*, 3>)",
        "flash_fwd": "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, "
                     f"4, false, false, {cu}, Flash_kernel_traits<128, 128, 64, 4, {cu}> >, "
                     "false, true, false, false, true, true, false, false>"
                     "(pytorch_flash::Flash_fwd_params)",
        "flash_bwd_dot": "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, "
                         "Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, "
                         f"{cu}, Flash_kernel_traits<128, 64, 128, 8, {cu}> > >"
                         "(pytorch_flash::Flash_bwd_params)",
        "flash_bwd": "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<"
                     "Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, "
                     f"{cu}, Flash_kernel_traits<128, 64, 128, 8, {cu}> >, false, true, false, "
                     "false, false, true, false>(pytorch_flash::Flash_bwd_params)",
        "flash_bwd_cvt": "void pytorch_flash::flash_bwd_convert_dq_kernel<"
                         "Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, "
                         f"{cu}, Flash_kernel_traits<128, 64, 128, 8, {cu}> > >"
                         "(pytorch_flash::Flash_bwd_params, int)",
        "softmax": f"void (anonymous namespace)::softmax_warp_forward<{c}, {c}, float, 11, "
                   f"false, false>({c}*, {c} const*, int, int, int, bool const*, int, bool)",
        "softmax_bwd": f"void (anonymous namespace)::softmax_warp_backward<{c}, {c}, float, 11, "
                       f"false, false>({c}*, {c} const*, {c} const*, int, int, int, "
                       "bool const*)",
        "bmm": names["fwd2"].replace("_tn", "_nn") if "_tn" in names["fwd2"] else names["fwd2"],
        "embed": "void at::native::(anonymous namespace)::indexSelectLargeIndex"
                 f"<{c}, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo"
                 f"<{c}, unsigned int>, at::cuda::detail::TensorInfo<{c} const, unsigned int>, "
                 "at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, "
                 "unsigned int, unsigned int, long)",
        "embed_bwd": "void at::native::(anonymous namespace)::embedding_backward_feature_kernel"
                     f"<{c}, float, long>(long const*, {c} const*, {c}*, int, long, int, int)",
        "logsoftmax": "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, "
                      "float, float, at::native::(anonymous namespace)::LogSoftMaxForward"
                      "Epilogue>(float*, float const*, int)",
        "nll": "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d"
               "<float, float, long>(float*, float*, float const*, long const*, float const*, "
               "bool, long, long, long, long)",
        "logsoftmax_bwd": "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, "
                          "float, float, float, at::native::(anonymous namespace)::"
                          "LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, long)",
        "adam": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                "(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::"
                "(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, "
                "false>, float*, double, double, double, double, double, bool, bool*, float*>"
                "(at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, "
                "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
                "(at::native::ADAM_MODE)1, false>, float*, double, double, double, double, "
                "double, bool, bool*, float*)",
        "adam_2022": "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, "
                     "float, float, float, float, float, float, adamMode_t, float>(long, int "
                     "volatile*, TensorListMetadata<4>, AdamFunctor<float>, float, float, float, "
                     "float, float, float, adamMode_t, float)",
        "l2norm": "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
                  "(anonymous namespace)::TensorListMetadata<1>, at::native::(anonymous "
                  "namespace)::LpNormFunctor<float, (at::native::(anonymous namespace)::NormType)1"
                  ", float, float>, float*, int>(at::native::(anonymous namespace)::"
                  "TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, "
                  "(at::native::(anonymous namespace)::NormType)1, float, float>, float*, int)",
        "l2norm_cleanup": "void at::native::lpnorm_cleanup<float, (at::native::(anonymous "
                          "namespace)::NormType)1, float, float>(float const*, at::native::"
                          "TensorListAddresses, int)",
        "scale": f"{ew}at::native::AUnaryFunctor<float, float, float, at::native::"
                 "binary_internal::MulFunctor<float> >, at::detail::Array<char*, 2> >(int, "
                 "at::native::AUnaryFunctor<float, float, float, at::native::binary_internal::"
                 "MulFunctor<float> >, at::detail::Array<char*, 2>)",
    })
    return names


# Launch shape per role: (grid, block, registers per thread, shared memory bytes).
LAUNCH = {
    "gemm": ([48, 16, 1], [256, 1, 1], 238, 98304),
    "flash": ([16, 32, 1], [128, 1, 1], 255, 49152),
    "ln": ([2048, 1, 1], [128, 1, 1], 38, 0),
    "elementwise": ([65536, 1, 1], [128, 1, 1], 22, 0),
    "cast": ([1024, 1, 1], [128, 1, 1], 40, 33792),
    "softmax": ([4096, 1, 1], [128, 1, 1], 40, 0),
    "reduce": ([1024, 1, 1], [512, 1, 1], 32, 4096),
    "optimizer": ([320, 1, 1], [512, 1, 1], 72, 0),
    "nccl": ([24, 1, 1], [544, 1, 1], 96, 87568),
    "nccl_p2p": ([8, 1, 1], [640, 1, 1], 96, 42024),
}
