"""The engine: give every op, runtime call and GPU activity its true time.

Model (integer ns on the one true clock):
- Each rank has one CPU cursor; ops run back to back. The CPU never waits for the GPU except in
  a SYNC op (loss.item()), which blocks until the awaited GPU activity has ended.
- Each stream is a FIFO. An activity starts at max(launch call + latency, previous activity on
  the stream ended + gap, every dependency ended + event-wait latency).
- A collective (or a send/recv pair) is one instance shared by its members. A member *arrives*
  when its NCCL kernel starts. Once the last member has arrived, every member's kernel ends at
  last_arrival + transfer +/- a small jitter, never earlier than 3/4 of the transfer after the
  last arrival: no member ends before the last peer arrived.
Ranks advance round-robin until nothing can move; a schedule that cannot finish is a bug and
raises instead of looping.
"""

from __future__ import annotations

from collections import deque

from .clock import jitter
from .ops import END, SYNC, UNKNOWN

LAUNCH_LATENCY_NS = 2_500
EVENT_WAIT_NS = 1_200


class Instance:
    """One collective instance: who arrived when, and when it ended for each member."""

    __slots__ = ("key", "comm", "arrivals", "last_arrival", "last_rank")

    def __init__(self, key, comm):
        self.key = key
        self.comm = comm
        self.arrivals: list[tuple[int, object]] = []  # (rank, Gpu)
        self.last_arrival = UNKNOWN
        self.last_rank = -1


class _Rank:
    __slots__ = ("prog", "pc", "cpu_t", "queues", "last")

    def __init__(self, prog):
        self.prog = prog
        self.pc = 0
        self.cpu_t = prog.start_ns
        self.queues: dict[int, deque] = {}
        self.last: dict[int, object] = {}

    def finished(self) -> bool:
        return self.pc == len(self.prog.ops) and not any(self.queues.values())


def simulate(programs, seed: int, jitter_ns: int) -> dict:
    """Fill in true times for all programs in place; returns the collective instances by key."""
    insts: dict = {}
    ranks = [_Rank(p) for p in programs]
    while True:
        progress = False
        for st in ranks:
            progress |= _advance_cpu(st)
            progress |= _advance_gpu(st, insts, seed, jitter_ns)
        if all(st.finished() for st in ranks):
            return insts
        if not progress:
            stuck = [(st.prog.rank, st.pc) for st in ranks if not st.finished()]
            raise RuntimeError(f"synthetic schedule cannot finish; stuck (rank, op): {stuck[:8]}")


def _enqueue(st: _Rank, op) -> None:
    for rt in op.rts:
        for g in rt.gpus:
            g.launch = op.t0 + rt.rel + LAUNCH_LATENCY_NS
            q = st.queues.get(g.stream)
            if q is None:
                q = st.queues[g.stream] = deque()
            q.append(g)


def _advance_cpu(st: _Rank) -> bool:
    ops, moved = st.prog.ops, False
    while st.pc < len(ops):
        op = ops[st.pc]
        if op.kind == SYNC:
            if op.t0 == UNKNOWN:
                op.t0 = st.cpu_t
                _enqueue(st, op)
                moved = True
            if op.ref.end == UNKNOWN:
                return moved
            rt = next(r for r in op.rts if r.stretch)
            op.block = max(0, op.ref.end + 1_500 - (op.t0 + rt.rel + rt.dur))
            st.cpu_t = op.t0 + op.total + op.block
        else:
            op.t0 = st.cpu_t
            if op.kind == END:
                op.ref.cpu[0].dur = op.t0 - op.ref.t0
            elif op.rts:
                _enqueue(st, op)
            st.cpu_t += op.total
        st.pc += 1
        moved = True
    return moved


def _advance_gpu(st: _Rank, insts: dict, seed: int, jitter_ns: int) -> bool:
    moved, changed = False, True
    while changed:
        changed = False
        for stream, q in st.queues.items():
            while q:
                g = q[0]
                prev = st.last.get(stream)
                if prev is not None and prev.end == UNKNOWN:
                    break
                t = g.launch
                if prev is not None:
                    t = max(t, prev.end + g.gap)
                if any(d.end == UNKNOWN for d in g.deps):
                    break
                for d in g.deps:
                    t = max(t, d.end + EVENT_WAIT_NS)
                g.start = t
                if g.comm is None:
                    g.end = t + g.dur
                else:
                    _arrive(st.prog.rank, g, insts, seed, jitter_ns)
                q.popleft()
                st.last[stream] = g
                changed = moved = True
    return moved


def _arrive(rank: int, g, insts: dict, seed: int, jitter_ns: int) -> None:
    c = g.comm
    inst = insts.get(c.key)
    if inst is None:
        inst = insts[c.key] = Instance(c.key, c)
    inst.arrivals.append((rank, g))
    if len(inst.arrivals) > len(c.members):
        raise RuntimeError(f"collective {c.key} got more arrivals than members {c.members}")
    if len(inst.arrivals) < len(c.members):
        return
    last_rank, last = max(((r, m.start) for r, m in inst.arrivals), key=lambda x: (x[1], x[0]))
    inst.last_arrival, inst.last_rank = last, last_rank
    amp = min(jitter_ns, c.transfer // 4)
    for r, m in inst.arrivals:
        m.end = last + c.transfer + jitter(amp, seed, *c.key, r)
        m.dur = m.end - m.start
