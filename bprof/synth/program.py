"""Turn a Scenario into one work list per rank: a Megatron-like training step, repeated.

Per step (main thread unless noted): ProfilerStep#N range; data loading (+ stall fault); batch
HtoD memcpy; grad-buffer memset; the pipeline schedule of forward / backward (autograd thread)
microbatches with TP all-reduces inside layers, PP send/recv between stages and DP gradient
buckets during the last backward; Work.wait() per bucket; a CUDA-graph replay (modern only);
the fused optimizer; a loss.item() that blocks the CPU until the GPU is done.
Layer recipes live in layers.py. Random draws never depend on faults, so a run with a fault
removed (the counterfactual in truth.py) differs only by that fault.
"""

from __future__ import annotations

import random
from collections import Counter

from . import layers
from .catalog import ELEM_BYTES, TORCH_DTYPE, comm_ns, kernel_names, mem_ns, nccl_kernel_name
from .clock import mix
from .layers import NONE, S, T, shapes
from .ops import (BEGIN, BWD, COMPUTE_STREAM, DP_STREAM, END, MAIN, OP, PP_NEXT_STREAM,
                  PP_PREV_STREAM, SYNC, TP_STREAM, Comm, Cpu, Gpu, N, Op, R, layout)
from .scenario import Scenario, Topology
from .schedule import stage_actions

C10D = {"allreduce": "c10d::allreduce_", "allgather": "c10d::_allgather_base_",
        "reduce_scatter": "c10d::_reduce_scatter_base_", "broadcast": "c10d::broadcast_",
        "send": "c10d::send", "recv": "c10d::recv_"}
ANNOT = {"allreduce": "nccl:all_reduce", "allgather": "nccl:_all_gather_base",
         "reduce_scatter": "nccl:_reduce_scatter_base", "broadcast": "nccl:broadcast",
         "send": "nccl:send", "recv": "nccl:recv"}


def _uniform_int(rng: random.Random):
    """rng.randint without its overhead (it dominated build time)."""
    r = rng.random
    return lambda lo, hi: lo + int(r() * (hi - lo + 1))


class Program:
    """One rank's work list and the facts the writer and the truth need about it."""

    def __init__(self, rank: int):
        self.rank = rank
        self.ops: list[Op] = []
        self.comms: list[Comm] = []
        self.step_ops: list[Op] = []     # BEGIN op of each ProfilerStep
        self.start_ns = 0                # true CPU time of the first op
        self.pid = 0
        self.tids = (0, 0)               # main thread, autograd thread
        self.lead_ns = 0                 # profiler starts this long before the first step
        self.tail_ns = 0                 # ... and stops this long after the last


class RankBuilder:
    def __init__(self, sc: Scenario, topo: Topology, rank: int, faults):
        self.sc, self.topo, self.rank = sc, topo, rank
        self.modern = sc.fmt == "modern"
        self.dev = sc.device
        self.act_dtype = TORCH_DTYPE[sc.compute_dtype]
        self.fp8 = sc.compute_dtype == "fp8"  # linear GEMMs as torch._scaled_mm on e4m3 operands
        self.names = kernel_names(sc.device, sc.compute_dtype)
        self.stage, self.dpi, self.tpi = topo.coords(rank)
        self.host = topo.host(rank)
        self.tp_group, self.dp_group = topo.tp_group(rank), topo.dp_group(rank)
        self.pp_group = topo.pp_group(rank)
        self.rng = random.Random(mix(sc.seed, rank, 1))
        self.rnd = _uniform_int(self.rng)
        self.rnd_dp = _uniform_int(random.Random(mix(sc.seed, rank, 2)))  # DP buckets only
        self.prog = Program(rank)
        self.pending: list[Gpu] = []     # deps of the next compute kernel
        self.last_compute: Gpu | None = None
        self.step = 0
        self.step_kernels: list[list[Gpu]] = [[] for _ in range(sc.steps)]
        self.seqnr = 4000 + self.rnd(0, 50_000)
        self.fwd_seq: dict = {}
        self.coll_k: Counter = Counter()
        self.p2p_k: Counter = Counter()
        self.dp_work: list[Gpu] = []
        self.deferred: list[Op] = []
        self.faults = tuple(faults)
        self._apply_faults(faults)

    def _apply_faults(self, faults) -> None:
        self.compute_factor = 1.0
        self.layer_factor = 1.0
        self.stall_ns = 0
        self.slow_extra_ns = 0
        self.exposed = False
        for f in faults:
            if f.kind == "slow_host" and f.host == self.host:
                self.compute_factor *= f.factor
            elif f.kind == "stage_imbalance" and self.stage == self.sc.pp - 1:
                self.layer_factor *= f.factor
            elif f.kind == "stalled_input" and f.rank in (None, self.rank):
                self.stall_ns += f.extra_ns
            elif f.kind == "slow_rank" and f.rank == self.rank:
                self.slow_extra_ns += f.extra_ns
            elif f.kind == "exposed_comm":
                self.exposed = True

    # --- primitives used by layers.py ----------------------------------------------------------

    def kern(self, key, shape, dur, *, layer=False, cat="kernel", nbytes=0, graph=None,
             flops=0) -> Gpu:
        """A compute-stream activity; it waits for whatever comm results are pending. `flops`:
        the matmul/attention FLOPs this kernel executes for its launching op (planted truth)."""
        noise = 1.0 + 0.06 * (self.rng.random() - 0.5)
        gap = self.rnd(700, 2400)
        if cat == "kernel":
            noise *= self.compute_factor * (self.layer_factor if layer else 1.0)
        name = self.names[key] if cat == "kernel" else key
        g = Gpu(COMPUTE_STREAM, cat, name, max(1000, int(dur * noise)), shape,
                deps=tuple(self.pending), gap=gap, nbytes=nbytes, graph=graph, step=self.step,
                flops=flops)
        self.pending = []
        self.last_compute = g
        if cat == "kernel":
            self.step_kernels[self.step].append(g)
        return g

    def launch(self, g: Gpu) -> R:
        return R("cudaLaunchKernel", 211, (g,), dur=self.rnd(3000, 9000))

    def emit(self, thread, roots, kind=OP, ref=None, rnd=None, append=True) -> Op:
        cpu, rts, total = layout(roots, rnd or self.rnd)
        op = Op(kind, thread, cpu, rts, total, ref, self.step)
        if append:
            self.prog.ops.append(op)
        return op

    def begin(self, name) -> Op:
        op = Op(BEGIN, MAIN, [Cpu(0, 0, name, "user_annotation", None, False)], [],
                self.rnd(2000, 6000), None, self.step)
        self.prog.ops.append(op)
        return op

    def end(self, begin: Op) -> None:
        self.prog.ops.append(Op(END, MAIN, [], [], self.rnd(1000, 3000), begin, self.step))

    def info(self, *inputs, seq=None, bwd=False):
        d = {"shapes": shapes(*inputs)} if inputs else {}
        if seq is not None:
            d["seq"], d["bwd"] = seq, bwd
        return d

    def fwd_op_seq(self, mb, key) -> int:
        self.seqnr += 1
        self.fwd_seq[(mb, key)] = self.seqnr
        return self.seqnr

    def comm(self, op, group, in_n, out_n, dtype, stream, *, blocking, peer=None, rnd=None):
        """A c10d call ⊃ record_param_comms ⊃ (event calls, nccl:* range, kernel launch)."""
        rnd = rnd or self.rnd
        if op in ("send", "recv"):
            src, dst = (self.rank, peer) if op == "send" else (peer, self.rank)
            n = self.p2p_k[(src, dst)]
            self.p2p_k[(src, dst)] += 1
            key, members = (1, src, dst, n), (src, dst)
        else:
            k = self.coll_k[group.index]
            self.coll_k[group.index] += 1
            key, members = (0, group.index, k), group.ranks
        nbytes = (out_n if op == "allgather" else in_n) * ELEM_BYTES[dtype]
        transfer = comm_ns(self.dev, op, nbytes, len(members), self.topo.spans_hosts(members))
        link = self.topo.link_factor(self.faults, members)
        if link != 1.0:
            transfer = round(transfer * link)
        c = Comm(op, group, in_n, out_n, dtype, key, members, transfer, self.step, peer)
        deps = (self.last_compute,) if self.last_compute is not None and op != "recv" else ()
        g = Gpu(stream, "kernel", nccl_kernel_name(self.sc.fmt, op, dtype, nbytes),
                0, "nccl_p2p" if peer is not None else "nccl", deps=deps, comm=c,
                gap=rnd(700, 2400), step=self.step)
        if blocking:
            self.pending.append(g)
        self.prog.comms.append(c)
        launch = (R("cudaLaunchKernelExC", 430, (g,), dur=rnd(6000, 15000)) if self.modern
                  else R("cudaLaunchKernel", 211, (g,), dur=rnd(5000, 12000)))
        inner = [R("cudaEventRecord", 135, dur=rnd(1500, 3500)),
                 R("cudaStreamWaitEvent", 147, dur=rnd(1000, 2500)),
                 N(ANNOT[op], cat="user_annotation", info={"kind": "annot", "comm": c},
                   dur=rnd(30_000, 90_000)),
                 launch]
        node = N(C10D[op], [N("record_param_comms", inner, info={"kind": "rpc", "comm": c})],
                 info={"kind": "c10d", "comm": c})
        return node, g

    def tp_allreduce(self, thread, nelems, dtype=None):
        if self.sc.tp > 1:
            node, _ = self.comm("allreduce", self.tp_group, nelems, nelems,
                                dtype or self.act_dtype, TP_STREAM, blocking=True)
            self.emit(thread, [node])

    def wait(self, g: Gpu) -> None:
        """Work.wait(): the compute stream waits for `g`; modern traces record it."""
        if self.modern:
            self.emit(MAIN, [N("record_param_comms", [R("cudaStreamWaitEvent", 147,
                                                          dur=self.rnd(1000, 2500))],
                               info={"kind": "wait"})])
        self.pending.append(g)

    # --- data parallel buckets ----------------------------------------------------------------

    def dp_bucket(self, nelems: int) -> None:
        """One gradient bucket, issued from the autograd thread (or deferred: exposed_comm)."""
        if self.sc.dp == 1:
            return
        dp = self.sc.dp
        nelems = -(-nelems // dp) * dp
        if self.sc.dp_mode == "zero1":
            node, g = self.comm("reduce_scatter", self.dp_group, nelems, nelems // dp, "Float",
                                DP_STREAM, blocking=False, rnd=self.rnd_dp)
        else:
            node, g = self.comm("allreduce", self.dp_group, nelems, nelems, "Float", DP_STREAM,
                                blocking=False, rnd=self.rnd_dp)
        self.dp_work.append(g)
        if self.exposed:
            self.deferred.append(self.emit(MAIN, [node], rnd=self.rnd_dp, append=False))
        else:
            wrap = "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad"
            self.emit(BWD, [N(wrap, [N("torch::autograd::AccumulateGrad"), node])],
                      rnd=self.rnd_dp)

    # --- one step -----------------------------------------------------------------------------

    def build(self) -> Program:
        sc, prog = self.sc, self.prog
        prog.start_ns = sc.start_ns + self.rnd(0, 300_000)
        prog.pid = 1000 + mix(sc.seed, self.rank, 3) % 3_000_000
        prog.tids = (prog.pid, prog.pid + 40 + mix(sc.seed, self.rank, 4) % 9000)
        prog.lead_ns = self.rnd(1_500_000, 2_500_000)
        prog.tail_ns = self.rnd(800_000, 1_500_000)
        for i in range(sc.steps):
            self.build_step(i)
        self._plant_slow_rank()
        self._number_comms()
        return prog

    def build_step(self, i: int) -> None:
        sc, s, b, h = self.sc, self.sc.seq_len, self.sc.micro_batch_size, self.sc.hidden
        self.step = i
        ps = self.begin(f"ProfilerStep#{sc.first_step + i}")
        self.prog.step_ops.append(ps)
        load = self.rnd(250_000, 650_000) + self.stall_ns
        self.emit(MAIN, [N("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
                           cat="user_annotation", dur=load)])
        nbytes = sc.microbatches * b * s * 8 * 2  # tokens + labels, int64
        g = self.kern("Memcpy HtoD (Pageable -> Device)", None, 6000 + nbytes // 11,
                      cat="gpu_memcpy", nbytes=nbytes)
        self.emit(MAIN, [N("aten::to", [N("aten::_to_copy", [N("aten::copy_", [
            R("cudaMemcpyAsync", 41, (g,), dur=self.rnd(8000, 20000))])])],
            info=self.info(T([sc.microbatches * b, s], "Long"), NONE, NONE, S("False")))])
        grad_bytes = layers.rank_params(self) * 4
        g = self.kern("Memset (Device)", None, mem_ns(self.dev, grad_bytes), cat="gpu_memset",
                      nbytes=grad_bytes)
        self.emit(MAIN, [N("aten::zero_", [R("cudaMemsetAsync", 51, (g,),
                                               dur=self.rnd(5000, 15000))],
                           info=self.info(T([grad_bytes // 4], "Float")))])

        acts = stage_actions(sc.schedule, self.stage, sc.pp, sc.microbatches)
        last_b = [mb for a, mb in acts if a == "B"][-1]
        for act, mb in acts:
            if act == "F":
                layers.forward(self, mb)
            elif act == "B":
                layers.backward(self, mb, grad_sync=(mb == last_b))
            else:
                self.p2p(act, mb)

        for op in self.deferred:  # exposed_comm: buckets go out only now, after the backward
            op.thread = MAIN
            for rt in op.rts:
                for g in rt.gpus:
                    g.deps = (self.last_compute,)
            self.prog.ops.append(op)
        self.deferred = []
        for g in self.dp_work:
            self.wait(g)
        self.dp_work = []
        layers.optimizer(self)
        if sc.dp_mode == "zero1" and sc.dp > 1:
            n = -(-layers.rank_params(self) // sc.dp)
            node, g = self.comm("allgather", self.dp_group, n, n * sc.dp, self.act_dtype,
                                DP_STREAM, blocking=False)
            self.emit(MAIN, [node])
            self.wait(g)
        g = self.kern("Memcpy DtoH (Device -> Pageable)", None, 2500, cat="gpu_memcpy", nbytes=4)
        self.emit(MAIN, [N("aten::item", [N("aten::_local_scalar_dense", [
            R("cudaMemcpyAsync", 41, (g,), dur=self.rnd(8000, 16000)),
            R("cudaStreamSynchronize", 131, dur=self.rnd(3000, 8000), stretch=True)],
            stretch=True)], info=self.info(T([], "Float")), stretch=True)], kind=SYNC, ref=g)
        self.end(ps)

    def p2p(self, act, mb) -> None:
        sc = self.sc
        nelems = sc.seq_len * sc.micro_batch_size * sc.hidden
        hop = sc.tp * sc.dp
        op, peer, stream = {
            "send_f": ("send", self.rank + hop, PP_NEXT_STREAM),
            "recv_b": ("recv", self.rank + hop, PP_NEXT_STREAM),
            "recv_f": ("recv", self.rank - hop, PP_PREV_STREAM),
            "send_b": ("send", self.rank - hop, PP_PREV_STREAM),
        }[act]
        node, _ = self.comm(op, self.pp_group, nelems, nelems, self.act_dtype, stream,
                            blocking=(op == "recv"), peer=peer)
        self.emit(MAIN, [node])

    # --- post passes --------------------------------------------------------------------------

    def _plant_slow_rank(self) -> None:
        """slow_rank: spread exactly extra_ns per step over that step's compute kernels."""
        if not self.slow_extra_ns:
            return
        for ks in self.step_kernels:
            total = sum(g.dur for g in ks)
            given = 0
            for g in ks:
                add = self.slow_extra_ns * g.dur // total
                g.dur += add
                given += add
            max(ks, key=lambda g: g.dur).dur += self.slow_extra_ns - given

    def _number_comms(self) -> None:
        """`Seq`: per-group counters as if the job had run first_step steps before the window."""
        sc = self.sc
        per_group = Counter(c.group.index for c in self.prog.comms if c.peer is None)
        n_p2p = sum(1 for c in self.prog.comms if c.peer is not None)
        k_p2p = 0
        for c in self.prog.comms:
            if c.peer is None:
                c.seq = 1 + sc.first_step * per_group[c.group.index] // sc.steps + c.key[2]
            else:
                c.seq = 1 + sc.first_step * n_p2p // sc.steps + k_p2p
                k_p2p += 1


def build_programs(sc: Scenario, topo: Topology, faults=None) -> list[Program]:
    faults = sc.faults if faults is None else faults
    return [RankBuilder(sc, topo, r, faults).build() for r in range(topo.world)]
