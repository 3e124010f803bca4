"""The `microbatches=M` scenario's model: the step of a pipeline run with M micro-batches of the same
size, from a chunk-level pipeline of its measured stages replayed with the one engine.

Per stage s (median over the stage's ranks; stages from bubbles_stages, the measured micro-batch
count m and schedule from bubbles_runs), from each rank's own send/recv times in the step:
- its pipeline section runs from its first send/recv to its last (a send counts at its post, a recv
  at its end); pre_s / post_s: the step before / after it (data loading, optimizer, gradient sync:
  kept as measured). Its busy time in the section = the bubbles analysis's span_ns - bubble_ns (the step less
  its exposed send/recv time: on GPU a recv kernel that runs beside compute is not waiting) less
  pre_s and post_s. The section holds m forwards and backwards (m-1 on the first stage, whose first
  forward comes before its first send and last backward after its last recv; with interleaving v*m
  and v*m-1, one per model chunk): u_s = busy / that count is one micro-batch's forward + backward
  (of one chunk), and forward F_s = u_s / 3, backward B_s = 2 u_s / 3 (the usual 1:2 of their FLOPs;
  only the fill and drain depend on the split). The first stage's pre and post lose that first
  forward and last backward.
- c_s: the median transfer of its recvs matched with their send (a join: the member's exit after
  the last arrival); 0 when no recv of the stage was matched (a solo recv's duration includes its
  wait, not a transfer), and the assumptions say so.
The model pipeline: each stage runs its chunks in the schedule's order (1F1B: p-1-s warm-up
forwards, one forward one backward, cool-down backwards; GPipe: all forwards, then all backwards;
interleaved 1F1B: Megatron's virtual pipeline, stage s holding model chunks s, s+p, .., s+(v-1)p, its
forwards and backwards in groups of p micro-batches per chunk, (p-1-s)*2 + (v-1)*p warm-up forwards,
all of them when m = p; the last stage hands a micro-batch to the first for its next chunk);
a chunk that needs a neighbour's output first receives it: a join that ends c_s after both the
send and the recv were posted; a send does not hold its sender (a ghost rank per message carries
the post time to the join). The engine replays it with m and with M micro-batches; each rank's
predicted step = its replayed step (the other parts applied) + the model's change of its stage's
end (M vs m): exact at M = m, and the measured step's own irregularities stay.
"""

from __future__ import annotations

import dataclasses
import warnings

import duckdb
import numpy as np

from bprof.errors import UsageError
from bprof.whatif.engine import StepGraph, replay
from bprof.whatif.graph import StepModel

FORWARD_SHARE = 1 / 3


@dataclasses.dataclass(frozen=True)
class Pipeline:
    num_stages: int
    num_microbatches: int
    schedule: str  # 1f1b, gpipe or interleaved-1f1b
    schedule_known: bool = True  # False: the send/recv calls do not tell (m <= p) and none was declared: 1f1b assumed
    num_chunks: int = 1  # model chunks per stage (interleaved-1f1b)

    @classmethod
    def of_run(cls, con: duckdb.DuckDBPyConnection, run_id: int, scenario: str) -> "Pipeline":
        has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'bubbles_runs' AND NOT temporary").fetchone()[0]
        row = con.execute("SELECT num_stages, num_microbatches, schedule, num_chunks FROM bubbles_runs WHERE run_id = ?",
                          [run_id]).fetchone() if has else None
        if row is None or row[0] is None or row[0] < 2 or not row[1]:
            raise UsageError(f"scenario {scenario!r}: run {run_id} has no pipeline (the bubbles analysis found no "
                             "stages and micro-batches in its send/recv calls)")
        if row[1] < 2:
            raise UsageError(f"scenario {scenario!r}: run {run_id} has {row[1]} micro-batch per step; the model "
                             "measures a micro-batch's work from at least 2")
        return cls(int(row[0]), int(row[1]), row[2] or "1f1b", row[2] is not None, int(row[3] or 1))


@dataclasses.dataclass(frozen=True)
class StageTimes:
    """Per stage (index = stage): start offset, pre, forward, backward, recv transfer, post (ns)."""

    start_ns: np.ndarray
    pre_ns: np.ndarray
    forward_ns: np.ndarray
    backward_ns: np.ndarray
    transfer_ns: np.ndarray
    post_ns: np.ndarray
    chunks: int = 1  # model chunks per stage: forward_ns and backward_ns are one chunk's


def stage_times(m: StepModel, pipe: Pipeline, busy_ns: dict[int, int], work: np.ndarray,
                exit_after: np.ndarray) -> StageTimes | None:
    """The model's inputs from one step (None when a stage has no rank with send/recv calls and a
    busy time). busy_ns: per rank, bubbles_stages.span_ns - bubble_ns of the step. `work` and `exit_after` are
    the state as the other parts left it: their change inside a rank's section is added to its busy
    time (work) and, for calls other than recvs, to it as well."""
    g = m.g
    joined = np.bincount(g.instance, minlength=len(m.op))[g.instance] >= 2
    op = m.op[g.instance]
    # a matched send/recv pair is one 'p2p' instance; its sender plays the odd role (graph.sql)
    p2p = (op == "p2p") | (op == "send") | (op == "recv")
    is_send = p2p & ((m.role % 2 == 1) | (op == "send"))
    is_recv = p2p & ~is_send
    own_end = np.where(is_send, g.arrival_ns, g.end_ns)
    per_stage: dict[int, list[tuple]] = {}
    bounds = np.flatnonzero(np.r_[True, g.rank[1:] != g.rank[:-1], True])
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        k = g.row_span[lo]
        s = int(m.stage[k])
        rows = np.arange(lo, hi)
        mine = rows[p2p[rows]]
        rank = int(g.span_rank[k])
        if s < 0 or s >= pipe.num_stages or not len(mine) or rank not in busy_ns:
            continue
        start, end = int(g.arrival_ns[mine].min()), int(own_end[mine].max())
        span_start, span_end = int(g.span_start_ns[k]), int(g.span_end_ns[k])
        pre, post = start - span_start, span_end - end
        inside = rows[(g.arrival_ns[rows] >= start) & (g.arrival_ns[rows] <= end)]
        changed = int((work[inside] - m.work[inside]).sum() + (exit_after[inside] - m.exit_after[inside])[~is_recv[inside]].sum())
        chunks = pipe.num_chunks * pipe.num_microbatches - (1 if s == 0 else 0)
        u = max(busy_ns[rank] - pre - post + changed, 0) / chunks
        if s == 0:  # its first forward is before its first send, its last backward after its last recv
            pre, post = pre - FORWARD_SHARE * u, post - (1 - FORWARD_SHARE) * u
        recv = mine[is_recv[mine] & joined[mine]]
        transfer = np.median(exit_after[recv]) if len(recv) else np.nan
        per_stage.setdefault(s, []).append((span_start, max(pre, 0), u, transfer, max(post, 0)))
    if len(per_stage) < pipe.num_stages:
        return None
    with warnings.catch_warnings():  # a stage without a matched recv: all-NaN transfer, 0 below
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.array([np.nanmedian(np.array(per_stage[s], dtype=float), axis=0) for s in range(pipe.num_stages)])
    med[:, 3] = np.nan_to_num(med[:, 3], nan=0.0)
    start = med[:, 0] - med[:, 0].min()
    return StageTimes(np.rint(start).astype(np.int64), np.rint(med[:, 1]).astype(np.int64),
                      np.rint(FORWARD_SHARE * med[:, 2]).astype(np.int64), np.rint((1 - FORWARD_SHARE) * med[:, 2]).astype(np.int64),
                      np.rint(med[:, 3]).astype(np.int64), np.rint(med[:, 4]).astype(np.int64), pipe.num_chunks)


def order(schedule: str, stage: int, stages: int, microbatches: int) -> list[tuple[str, int]]:
    """(F|B, micro-batch) in the order one stage runs them (1f1b, gpipe)."""
    if schedule == "gpipe":
        return [("F", k) for k in range(microbatches)] + [("B", k) for k in range(microbatches)]
    warmup = min(stages - 1 - stage, microbatches)
    out = [("F", k) for k in range(warmup)]
    for i in range(microbatches - warmup):
        out += [("F", warmup + i), ("B", i)]
    return out + [("B", k) for k in range(microbatches - warmup, microbatches)]


def interleaved_order(stage: int, stages: int, microbatches: int, chunks: int) -> list[tuple[str, int, int]]:
    """(F|B, micro-batch, chunk of the stage) in the order one stage runs them under Megatron's
    interleaved 1F1B (forward_backward_pipelining_with_interleaving): virtual micro-batch k is
    micro-batch (k // (p*v)) * p + k % p on chunk (k % (p*v)) // p, backwards on the chunks in reverse."""
    p, v, m = stages, chunks, microbatches
    if m % p:
        raise UsageError(f"interleaved 1F1B needs micro-batches divisible by the {p} stages (as Megatron), not {m}")
    total = v * m
    warmup = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)

    def item(kind, k):
        c = (k % (p * v)) // p
        return kind, (k // (p * v)) * p + k % p, c if kind == "F" else v - 1 - c

    out = [item("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        out += [item("F", warmup + k), item("B", k)]
    return out + [item("B", k) for k in range(total - warmup, total)]


def stage_ends(t: StageTimes, schedule: str, microbatches: int) -> np.ndarray:
    """Each stage's replayed end (ns after the earliest stage start) with `microbatches`."""
    p = len(t.pre_ns)
    v = t.chunks if schedule == "interleaved-1f1b" else 1
    last = p * v - 1  # the last model chunk; model chunk c*p + s is chunk c of stage s
    chains: list[list[tuple[int, int, int]]] = [[] for _ in range(p)]  # per rank: (instance, work before, exit after)
    send_of: dict[tuple[str, int, int], int] = {}  # (F|B, micro-batch, receiving model chunk) -> join instance
    ghosts: list[tuple[int, list[tuple[int, int, int]]]] = []  # (sender stage, chain)
    n_inst = 0
    for s in range(p):
        pending = int(t.pre_ns[s])  # work since the stage's last join
        items = (interleaved_order(s, p, microbatches, v) if v > 1
                 else [(kind, k, 0) for kind, k in order(schedule, s, p, microbatches)])
        for chunk, k, c in items:
            fwd = chunk == "F"
            mc = c * p + s
            src = mc - 1 if fwd else mc + 1
            if 0 <= src <= last:  # receive the neighbour's output: the join of this message
                key = (chunk, k, mc)
                if key not in send_of:
                    send_of[key] = n_inst
                    n_inst += 1
                chains[s].append((send_of[key], pending, int(t.transfer_ns[s])))
                pending = 0
            pending += int(t.forward_ns[s] if fwd else t.backward_ns[s])
            dst = mc + 1 if fwd else mc - 1
            if 0 <= dst <= last:  # post the send: a ghost joins the sender here and the receiver's join later
                key = (chunk, k, dst)
                if key not in send_of:
                    send_of[key] = n_inst
                    n_inst += 1
                post = n_inst
                n_inst += 1
                chains[s].append((post, pending, 0))
                pending = 0
                ghosts.append((s, [(post, 0, 0), (send_of[key], 0, 0)]))
        chains[s].append((-1, pending, 0))  # the work after the last join: the tail
    all_chains = chains + [c for _, c in ghosts]
    ranks = np.arange(len(all_chains))
    starts = np.r_[t.start_ns, [t.start_ns[s] for s, _ in ghosts]].astype(np.int64)
    topo = _topological(all_chains, n_inst)
    inst, rank, work, exit_after, tail = [], [], [], [], np.zeros(len(all_chains), dtype=np.int64)
    for r, chain in enumerate(all_chains):
        for i, w, x in chain:
            if i < 0:
                tail[r] = w
                continue
            inst.append(i), rank.append(r), work.append(w), exit_after.append(x)
    inst_a = np.asarray(inst, dtype=np.int64)
    at = topo[inst_a]
    g = StepGraph.build(inst_a, np.asarray(rank), at, at, ranks, starts, starts, instance_ids=np.arange(n_inst),
                        previous_exit_only=True)
    r = replay(g, np.asarray(work, dtype=np.int64)[g.source_row], tail, np.asarray(exit_after, dtype=np.int64)[g.source_row])
    return r.end_ns[:p] - starts.min()


def _topological(chains: list[list[tuple[int, int, int]]], n_inst: int) -> np.ndarray:
    """A position per instance such that every chain visits its instances in increasing position:
    an instance is placed when it heads the remaining chain of every member (Kahn's algorithm)."""
    members: dict[int, int] = {}
    for chain in chains:
        for i, _, _ in chain:
            if i >= 0:
                members[i] = members.get(i, 0) + 1
    heads = [0] * len(chains)
    waiting = dict.fromkeys(members, 0)
    position = np.full(n_inst, -1, dtype=np.int64)
    placed = 0
    ready = []

    def advance(c):  # chain c's next instance has one more member waiting at it
        if heads[c] < len(chains[c]) and chains[c][heads[c]][0] >= 0:
            i = chains[c][heads[c]][0]
            waiting[i] += 1
            if waiting[i] == members[i]:
                ready.append(i)

    for c in range(len(chains)):
        advance(c)
    on: dict[int, list[int]] = {}
    for c, chain in enumerate(chains):
        for i, _, _ in chain:
            if i >= 0:
                on.setdefault(i, []).append(c)
    while ready:
        i = ready.pop()
        position[i] = placed
        placed += 1
        for c in on[i]:
            heads[c] += 1
            advance(c)
    if placed != len(members):
        raise RuntimeError("the pipeline model deadlocked: a recv has no send")
    return position


def interleaved_step_ns(stage_work_ns: np.ndarray, microbatches: int, chunks: int) -> int:
    """The step of `microbatches` equal micro-batches through an interleaved 1F1B pipeline whose
    stage s takes stage_work_ns[s] for one chunk's forward and twice that for its backward (free
    transfers), replayed with the engine; (v*m + p - 1) x 3 t for equal stages."""
    work = np.asarray(stage_work_ns, dtype=np.int64)
    zero = np.zeros(len(work), dtype=np.int64)
    ends = stage_ends(StageTimes(zero, zero, work, 2 * work, zero, zero, chunks), "interleaved-1f1b", microbatches)
    return int(ends.max())


def flow_shop_ns(stage_work_ns: np.ndarray, microbatches: int) -> int:
    """The step of `microbatches` equal micro-batches flowing through stages that take
    stage_work_ns[s] each (a stage hands a micro-batch on and starts the next; no backward, free
    transfers), replayed with the engine: sum(t) + (m - 1) max(t), as a flow shop's makespan."""
    work = np.asarray(stage_work_ns, dtype=np.int64)
    zero = np.zeros(len(work), dtype=np.int64)
    ends = stage_ends(StageTimes(zero, zero, work, zero, zero, zero), "gpipe", microbatches)
    return int(ends.max())
