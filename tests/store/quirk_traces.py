"""Minimal Kineto traces that reproduce what real traces of current stacks showed, each named
after the trace that showed it (issue 21), for the cases whose original cannot be committed.

Only the events that carry the quirk are written, with the keys and spellings the original had.
"""

from __future__ import annotations

BASE_NS = 1790857026000000000
NCCL_STREAM = 20
COMPUTE_STREAM = 7
CUPTI_CBID = {"cudaLaunchKernel": 211, "cudaLaunchKernelExC": 430, "cuLaunchKernel": 307, "cuLaunchKernelEx": 652}


class _Builder:
    """Appends CPU ops, launches and their device work to one rank's event list."""

    def __init__(self, rank: int):
        self.rank = rank
        self.pid = self.tid = 1000 + rank
        self.events: list[dict] = []
        self.ext = 0
        self.corr = 100 * (rank + 1)

    def cpu(self, name: str, ts: float, dur: float, cat: str = "cpu_op", args: dict | None = None) -> int:
        self.ext += 1
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": self.tid,
                            "ts": ts, "dur": dur, "args": {"External id": self.ext, **(args or {})}})
        return self.ext

    def launch(self, api: str, ts: float, kernel: str, kernel_ts: float, kernel_dur: float,
               stream: int = COMPUTE_STREAM, kernel_args: dict | None = None) -> int:
        """A launch call (runtime `cuda*`, or driver `cu*` as NCCL >= 2.27 and Triton call it), its
        ac2g flow and the kernel it launched."""
        self.corr += 1
        cat = "cuda_runtime" if api.startswith("cuda") else "cuda_driver"
        self.events += [
            {"ph": "X", "cat": cat, "name": api, "pid": self.pid, "tid": self.tid, "ts": ts, "dur": 6.0,
             "args": {"External id": self.ext, "cbid": CUPTI_CBID[api], "correlation": self.corr}},
            {"ph": "s", "id": self.corr, "pid": self.pid, "tid": self.tid, "ts": ts, "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": self.corr, "pid": 0, "tid": stream, "ts": kernel_ts, "cat": "ac2g", "name": "ac2g",
             "bp": "e"},
            {"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": stream, "ts": kernel_ts, "dur": kernel_dur,
             "args": {"External id": self.ext, "queued": 0, "device": 0, "context": 1, "stream": stream,
                      "correlation": self.corr, "grid": [16, 1, 1], "block": [512, 1, 1], **(kernel_args or {})}},
        ]
        return self.corr


def _trace(rank: int, world_size: int, events: list[dict], device: str, nccl_version: str,
           pg_ranks: list[int]) -> dict:
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": device, "totalGlobalMem": 191_000_000_000, "computeMajor": 10,
                              "computeMinor": 0, "numSms": 148}],
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size, "pg_count": 1,
                            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                                           "pg_size": len(pg_ranks), "ranks": pg_ranks}],
                            "nccl_version": nccl_version},
        "host_name": "node0",
        "traceEvents": events,
        "traceName": "quirk",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_NS,
    }


def _comm_args(op: str, pg_ranks: list[int], in_elems: int, out_elems: int, dtype: str, seq: int) -> dict:
    return {"Collective name": op, "In msg nelems": in_elems, "Out msg nelems": out_elems, "Group size": len(pg_ranks),
            "dtype": dtype, "In split size": "[]", "Out split size": "[]", "Process Group Name": "0",
            "Process Group Description": "default_pg", "Process Group Ranks": str(pg_ranks), "Seq": seq}


def b200_vllm_tp8_driver_launch(rank: int, world_size: int = 8, steps=(1, 2)) -> dict:
    """B200, CUDA 13, NCCL 2.27 (the vLLM TP=8 trace): NCCL and Triton launch their kernels through
    the driver API (`cuLaunchKernelEx` / `cuLaunchKernel`, category `cuda_driver`), cuBLAS through
    the runtime. Each step: a GEMM, a Triton kernel and one all-gather; the Triton and NCCL kernels
    run after the step's CPU range has ended, so only their launch gives them a step."""
    b = _Builder(rank)
    ranks = list(range(world_size))
    for i, step in enumerate(steps):
        t0 = 1000.0 + i * 10_000.0
        b.cpu(f"ProfilerStep#{step}", t0, 5000.0, cat="user_annotation")
        b.cpu("aten::mm", t0 + 10, 100.0)
        b.launch("cudaLaunchKernel", t0 + 20, "sm100_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64", t0 + 200,
                 300.0)
        b.cpu("triton_poi_fused_add_0", t0 + 300, 40.0)
        b.launch("cuLaunchKernel", t0 + 310, "triton_poi_fused_add_0", t0 + 5600, 50.0)
        b.cpu("c10d::_allgather_base_", t0 + 1000, 80.0)
        args = _comm_args("_allgather_base", ranks, 1024, 1024 * world_size, "BFloat16", seq=i + 1)
        b.cpu("record_param_comms", t0 + 1005, 60.0, args={**args, "Rank": rank})
        b.launch("cuLaunchKernelEx", t0 + 1010, "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 t0 + 5700, 400.0, stream=NCCL_STREAM, kernel_args=args)
    return _trace(rank, world_size, b.events, "NVIDIA B200", "2.27.3", ranks)


def a100_ws16_empty_tensorlist(rank: int, world_size: int = 2) -> dict:
    """The 2023 A100 16-rank trace's sizes: absolute us, record_param_comms without arguments, and
    `c10d::allreduce_` whose TensorList input is written as `[]` (its tensors' dims not recorded)
    beside one written in full. (The original has no pg_config; one group is declared here so
    that the calls match across the two ranks and reach bandwidth.)"""
    b = _Builder(rank)
    shift_us = BASE_NS // 1000
    b.cpu("ProfilerStep#5", shift_us + 1000, 9000.0, cat="user_annotation")
    for i, dims in enumerate(([[], [], [], []], [[[1000]], [], [], []])):
        t0 = shift_us + 2000 + i * 3000
        b.cpu("c10d::allreduce_", t0, 80, args={"Input Dims": dims, "Input type": ["TensorList", "", "", "Scalar"]})
        b.cpu("record_param_comms", t0 + 5, 60,
              args={"Input Dims": [[], [], [], [], [], []], "Input type": ["Scalar", "Scalar", "Scalar", "", "", ""]})
        b.launch("cudaLaunchKernel", t0 + 10, "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", t0 + 100 + rank,
                 500 - rank, stream=NCCL_STREAM)
    trace = _trace(rank, world_size, b.events, "NVIDIA A100-SXM4-80GB", "2.14.3", list(range(world_size)))
    del trace["baseTimeNanoseconds"]
    return trace


def pp4_plain_profiler_p2p(rank: int, steps=(1, 2), microbatches: int = 2, peers: bool = True) -> dict:
    """A 4-stage pipeline taken with plain torch.profiler (no `bprof record`), one group of the 4
    ranks: each microbatch's activation goes forward, its gradient back. torch writes the peer on
    send (`Dst Rank`) and recv (`Src Rank`), global ranks; `Rank` is the peer's group rank, and
    `Seq` is the group's collective counter + 1, the same for every message until the next
    collective (here a loss all-reduce ends each step). `peers=False`: an older torch without them."""
    b = _Builder(rank)
    ranks = [0, 1, 2, 3]
    t = 1000.0
    for i, step in enumerate(steps):
        seq = i + 1
        b.cpu(f"ProfilerStep#{step}", t, 9000.0, cat="user_annotation")
        messages = []
        for mb in range(microbatches):
            if rank > 0:
                messages.append(("recv", rank - 1))
            if rank < 3:
                messages.append(("send", rank + 1))
        for mb in range(microbatches):
            if rank < 3:
                messages.append(("recv", rank + 1))
            if rank > 0:
                messages.append(("send", rank - 1))
        u = t + 100
        for op, peer in messages:
            args = _comm_args(op, ranks, 4096, 4096, "BFloat16", seq)
            args["Rank"] = peer
            if peers:
                args["Dst Rank" if op == "send" else "Src Rank"] = peer
            b.cpu("c10d::send" if op == "send" else "c10d::recv_", u, 60.0)
            b.cpu("record_param_comms", u + 5, 40.0, args=args)
            b.launch("cudaLaunchKernelExC", u + 10, "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
                     u + 30, 200.0, stream=NCCL_STREAM, kernel_args=args)
            u += 400
        b.cpu("c10d::allreduce_", t + 8000, 50.0)
        b.cpu("record_param_comms", t + 8005, 30.0, args={**_comm_args("allreduce", ranks, 1, 1, "Float", seq),
                                                          "Rank": rank})
        b.launch("cudaLaunchKernelExC", t + 8010, "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 t + 8100, 100.0, stream=NCCL_STREAM)
        t += 10_000
    return _trace(rank, 4, b.events, "NVIDIA H100 80GB HBM3", "2.21.5", ranks)
