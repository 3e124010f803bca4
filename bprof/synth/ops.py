"""The per-rank work list a program is made of, and the layout of nested CPU events.

A rank's program is an ordered list of `Op`s on one CPU cursor (the main thread and the autograd
thread never run at the same time). An op owns CPU events (`Cpu`, with offsets relative to the
op's start), runtime calls (`Rt`) and the GPU work they launch (`Gpu`). The engine in
timeline.py fills in the true times: `Op.t0`, `Op.block`, `Gpu.start`/`Gpu.end`.
All times are integer nanoseconds on the true (global) clock.
"""

from __future__ import annotations

# Op kinds.
OP, SYNC, BEGIN, END = 0, 1, 2, 3

# CPU threads of a rank: the main (training loop) thread and the autograd engine's device thread.
MAIN, BWD = 0, 1

# Streams (GPU rows have pid = device index, tid = stream id).
COMPUTE_STREAM = 7
TP_STREAM = 20
DP_STREAM = 24
PP_NEXT_STREAM = 28  # NCCL p2p communicator with the next pipeline stage
PP_PREV_STREAM = 32  # ... and with the previous one (torch makes one per peer pair)

UNKNOWN = -1


class Comm:
    """A collective or p2p call as record_param_comms describes it, plus its matching key."""

    __slots__ = ("op", "group", "in_nelems", "out_nelems", "dtype", "seq", "key", "members",
                 "transfer", "step", "peer")

    def __init__(self, op, group, in_nelems, out_nelems, dtype, key, members, transfer, step,
                 peer=None):
        self.op = op                  # allreduce | allgather | reduce_scatter | broadcast | send | recv
        self.group = group            # scenario.Group
        self.in_nelems = in_nelems
        self.out_nelems = out_nelems
        self.dtype = dtype            # record_param_comms dtype: BFloat16, Float, Long, ...
        self.seq = 0                  # set after the program is built (per-group counter)
        self.key = key                # int tuple, equal on every member of one instance
        self.members = members        # global ranks that take part
        self.transfer = transfer      # ns from the last arrival to the end
        self.step = step              # step index (0-based) in the profiled window
        self.peer = peer              # p2p: the other rank


class Gpu:
    """One GPU activity: a kernel, memcpy or memset on a stream."""

    __slots__ = ("stream", "cat", "name", "dur", "shape", "deps", "comm", "gap", "nbytes",
                 "graph", "launch", "start", "end", "step", "flops")

    def __init__(self, stream, cat, name, dur, shape, deps=(), comm=None, gap=1500, nbytes=0,
                 graph=None, step=0, flops=0):
        self.stream = stream
        self.cat = cat            # kernel | gpu_memcpy | gpu_memset
        self.name = name
        self.dur = dur            # compute: true duration; NCCL: decided at the last arrival
        self.shape = shape        # catalog.LAUNCH key (kernels only)
        self.deps = deps          # Gpu items (other streams) that must end before this starts
        self.comm = comm          # Comm for NCCL kernels
        self.gap = gap            # idle ns after the previous op on the same stream
        self.nbytes = nbytes      # memcpy / memset size
        self.graph = graph        # (graph id, graph node id) for CUDA-graph nodes
        self.launch = UNKNOWN     # earliest start (runtime call + launch latency)
        self.start = UNKNOWN
        self.end = UNKNOWN
        self.step = step
        self.flops = flops        # matmul FLOPs of the shape-recorded op that launched it (truth)


class Cpu:
    """A cpu_op or user_annotation; `rel` is relative to its op's start."""

    __slots__ = ("rel", "dur", "name", "cat", "info", "stretch", "ext")

    def __init__(self, rel, dur, name, cat, info, stretch):
        self.rel = rel
        self.dur = dur
        self.name = name
        self.cat = cat
        self.info = info          # dict: shapes, autograd seq, comm, ... (see program.py)
        self.stretch = stretch    # SYNC ops: dur grows by the op's blocking time
        self.ext = 0              # External id, assigned when the file is written


class Rt:
    """A CUDA runtime call; `owner` indexes the innermost enclosing Cpu of the same op."""

    __slots__ = ("rel", "dur", "name", "cbid", "owner", "gpus", "stretch", "corr")

    def __init__(self, rel, dur, name, cbid, owner, gpus, stretch):
        self.rel = rel
        self.dur = dur
        self.name = name
        self.cbid = cbid
        self.owner = owner
        self.gpus = gpus
        self.stretch = stretch
        self.corr = 0


class Op:
    __slots__ = ("kind", "thread", "cpu", "rts", "total", "t0", "block", "ref", "step")

    def __init__(self, kind, thread, cpu, rts, total, ref=None, step=0):
        self.kind = kind
        self.thread = thread      # 0 = main thread, 1 = autograd thread
        self.cpu = cpu
        self.rts = rts
        self.total = total        # CPU cursor advance, trailing gap included
        self.t0 = UNKNOWN
        self.block = 0            # SYNC: ns the CPU waited for the GPU
        self.ref = ref            # BEGIN for END; the awaited Gpu for SYNC
        self.step = step


# --- build-time tree of CPU nodes ---------------------------------------------------------------

class N:
    """A CPU node to lay out: leaf (own `dur`) or parent of N / R children."""

    __slots__ = ("name", "cat", "info", "children", "dur", "stretch")

    def __init__(self, name, children=(), info=None, cat="cpu_op", dur=0, stretch=False):
        self.name = name
        self.cat = cat
        self.info = info
        self.children = children
        self.dur = dur
        self.stretch = stretch


class R:
    """A runtime call to lay out, launching `gpus` (empty for e.g. cudaEventRecord)."""

    __slots__ = ("name", "cbid", "gpus", "dur", "stretch")

    def __init__(self, name, cbid, gpus=(), dur=4000, stretch=False):
        self.name = name
        self.cbid = cbid
        self.gpus = gpus
        self.dur = dur
        self.stretch = stretch


def layout(roots, rnd):
    """Flatten CPU node trees into (cpu events in pre-order, runtime calls, total ns).

    Children start a little after their parent and after each other; a parent ends a little
    after its last child, so nesting on one thread is strict. `rnd(lo, hi)` draws the gaps.
    """
    cpu: list[Cpu] = []
    rts: list[Rt] = []

    def place(node, t, owner):
        if isinstance(node, R):
            rts.append(Rt(t, node.dur, node.name, node.cbid, owner, node.gpus, node.stretch))
            return t + node.dur
        idx = len(cpu)
        ev = Cpu(t, 0, node.name, node.cat, node.info, node.stretch)
        cpu.append(ev)
        if node.children:
            cur = t + rnd(1200, 3500)
            for ch in node.children:
                cur = place(ch, cur, idx) + rnd(500, 2000)
            end = cur + rnd(600, 2500)
        else:
            own = rnd(900, 2500)  # drawn even when unused: faults must not shift the draws
            end = t + (node.dur or own)
        ev.dur = end - t
        return end

    t = 0
    for root in roots:
        t = place(root, t, -1) + rnd(1000, 4000)
    return cpu, rts, t
