"""What-if scenarios: each changes the work, tails or transfers of a step's graph before the replay.

A scenario string is one or more parts joined by "+", applied in order to the step as it stands
after the parts before it ("no-stragglers+scale:gemm=0.8"):

- `no-stragglers`: the ranks the straggler analysis flagged (stragglers_ranks.flagged) work like
  the median of their peers (bprof.whatif.peers: same pipeline stage, same count of each collective
  kind): each of their work segments becomes the median of that segment (the same occurrence of the
  same collective kind) over the other peers, their tail the peers' median tail, and they leave a
  symmetric collective (all-reduce, all-gather, reduce-scatter, barrier) no later than its first
  member: the counterfactual the straggler findings price, applied to all flagged ranks at once.
  Healthy ranks keep their own work (and its noise), transfers stay as measured.
- `scale:X=F`: the GPU work of kernel class X (a catalogue class: gemm, attention, norm, ...) or of
  the kernel/op named X takes F (> 0) x its time. On a rank that ran kernels in the step, each
  work segment changes by what the rank's launch-level graph of its captured steps
  (bprof.whatif.device_graph: CUDA calls per thread, launches, stream order, host syncs, calls
  blocked on a full launch queue) says: its end moves by the replayed shift of the last GPU work
  or training-thread call at or before it, less its start's shift; so faster
  kernels buy nothing where the host issues them slower than the GPU runs them, and a kernel that
  overlaps another stream buys only what the streams' order lets through. On a rank without kernels
  (CPU traces), X's time in each segment (its main-thread ops) is multiplied by F, the rest of the
  segment stays: assumed on the rank's critical path. Several scale parts of one scenario replay
  the device graph together: each part's change is its replay with the parts before it and itself
  less the replay with the parts before it, so they add up to one replay with all of them.
- `no-host-gaps`: the host gaps of each work segment are removed (as CUDA graphs, a prefetching data
  loader and no host syncs would): device idle time (breakdown_idle_gaps), and on CPU traces the
  data-loading ranges too. The device work around them stays. `no-host-gaps:CAUSE` removes only the
  gaps whose main cause (bprof/analyzers/idle.sql) is CAUSE: sync, gc, data_loading, launch_bound or
  host_other; the idle findings are priced with it.
- `free-comm:DIM`: the transfers of the collectives of parallel dimension DIM (breakdown_groups.dim:
  tp, dp, fsdp, pp, ...) cost nothing; waiting for the last peer stays. The exposed-communication
  findings are priced with it.
- `balanced-stages`: the slowest pipeline stage (bubbles_runs) does its work between collectives
  scaled to the other stages' median own work (busy_ns); waiting and transfers as measured.
- `coalesce-small[:BYTES]`: back-to-back collectives of at most BYTES (default 65536) bytes of one
  group and op (a storm of scalar all-reduces: metrics averaged one by one; the compute between two
  - their work less its host gaps - at most the first's transfer, so a tensor-parallel all-reduce
  after each layer is never one)
  are sent as one: each but the last of a batch costs nothing (its transfer and the host's call
  overhead before the next call go), the last keeps its transfer. The delay from each call to its
  start (queue, worker wake-up) and waiting for the last peer stay. The collective-storm finding is
  priced with it.
- `perfect-overlap`: each collective's transfer (its exit after the last member arrived) is hidden
  behind the compute of the member's work segment before it, as far as that compute reaches:
  exit after last arrival = max(0, transfer - (work before it - its host gaps)). Waiting for the
  last peer stays: overlap does not make a late peer early.
- `coll:bw=G,lat=U[,algo=ring|tree]`: every collective's transfer becomes the alpha-beta model
  time for its op, message size (nccl-tests bytes) and group size n, with link bandwidth G GB/s
  and latency U us. Ring: all_reduce 2(n-1)a + 2(n-1)/n S/B; all_gather, reduce_scatter,
  all_to_all, gather, scatter (n-1)a + (n-1)/n S/B; broadcast, reduce (n-1)a + S/B; p2p, send,
  recv a + S/B; barrier 2(n-1)a. Tree: all_reduce 2 ceil(log2 n) a + 2(n-1)/n S/B, broadcast and
  reduce ceil(log2 n) a + S/B, the others as ring. Instances of unknown size keep their transfer.
- `dp=N`: data-parallel scale-out to N ranks per data-parallel group (weak scaling: each rank's
  work as measured, the global batch N/D x larger, D the run's data-parallel degree): each
  collective of a dp or fsdp group of n ranks takes its measured transfer + model(n N / D) -
  model(n), the alpha-beta model of bprof.whatif.scaleout with the latency and bandwidth fitted
  from the run's own data-parallel transfers, or those of a coll: part of the same scenario.
  The ranks added are assumed to work like the measured ones.
- `microbatches=M`: a pipeline run with M micro-batches of the same size (bprof.whatif.pipeline:
  a chunk-level model of the measured stages replayed with m and with M micro-batches; its change
  of each stage's end is added to the replayed step). It changes the step's shape, so it applies
  after the other parts, whatever its place, on the work they leave.
"""

from __future__ import annotations

import dataclasses
import math
import re

import duckdb
import numpy as np

from bprof.errors import UsageError
from bprof.kernels.classify import FINE_CLASSES, classify_many
from bprof.whatif import device_graph, scaleout
from bprof.whatif.graph import StepModel, cause_gaps, matched_time
from bprof.whatif.peers import SYMMETRIC_OPS, PeerStep
from bprof.whatif.pipeline import Pipeline, stage_ends, stage_times
from bprof.whatif.scaleout import DP_DIMS


# the causes of device idle that bprof/analyzers/idle.sql attributes (idle_gaps.main_cause)
HOST_CAUSES = ("sync", "gc", "data_loading", "launch_bound", "host_other")


@dataclasses.dataclass
class State:
    """What the replay takes: work per member row, tail per span rank, exit after the last arrival per
    member row (all int64 ns)."""

    work: np.ndarray
    tail: np.ndarray
    exit_after: np.ndarray
    end_delta: np.ndarray  # per span rank: added to its replayed end (a change of the step's shape)

    @classmethod
    def measured(cls, m: StepModel) -> "State":
        return cls(m.work.copy(), m.tail.copy(), m.exit_after.copy(), np.zeros(len(m.tail), dtype=np.int64))


class Part:
    """One scenario part: `apply` changes the state of one step; `assumption` says what it assumed.
    A `late` part changes the step's shape: it applies after the others."""

    text: str
    late = False

    def prepare(self, con: duckdb.DuckDBPyConnection, run_id: int) -> None:
        """Look up what the part needs once per run (names of a class)."""

    def apply(self, con: duckdb.DuckDBPyConnection, run_id: int, m: StepModel, s: State) -> None:
        raise NotImplementedError

    def assumption(self) -> str:
        raise NotImplementedError

    def work_factor(self) -> float:
        """The model FLOPs of the changed step over the measured one's (MFU scales with it)."""
        return 1.0


class NoStragglers(Part):
    text = "no-stragglers"

    def __init__(self):
        self.ranks: list[int] = []

    def prepare(self, con, run_id):
        has = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'stragglers_ranks' AND NOT temporary").fetchone()[0]
        self.ranks = [r for (r,) in con.execute(
            "SELECT rank FROM stragglers_ranks WHERE run_id = ? AND flagged ORDER BY rank", [run_id]).fetchall()] if has else []

    def apply(self, con, run_id, m, s):
        present = set(self.ranks) & set(m.g.span_rank.tolist())
        if not present:
            return
        peers = PeerStep(m.g, m.role, m.stage, present, symmetric=np.isin(m.op, SYMMETRIC_OPS))
        work_in_order, tail, exit_in_order = peers.like_peers(present)
        # the change to the measured work and exits, added to the state as it stands (parts compose)
        s.work = s.work + (work_in_order[peers.order_position] - m.work)
        s.tail = s.tail + (tail - m.tail)
        s.exit_after = s.exit_after + (exit_in_order[peers.order_position] - m.exit_after)

    def assumption(self):
        who = f"ranks {self.ranks}" if self.ranks else "no rank (the straggler analysis flagged none: nothing changes)"
        return (f"no-stragglers: {who} flagged by the straggler analysis work between collectives like the median of "
                "their peers (same pipeline stage and collectives, the same segment of the step) and leave a symmetric "
                "collective no later than its first member does, as the straggler findings price them; the other ranks "
                "and all transfers as measured")


class NoHostGaps(Part):
    text = "no-host-gaps"

    def __init__(self, cause: str | None = None):
        self.cause = cause
        if cause:
            self.text = f"no-host-gaps:{cause}"

    def apply(self, con, run_id, m, s):
        if self.cause is None:
            s.work = _minus(s.work, m.host_ns)
            s.tail = _minus(s.tail, m.tail_host_ns)
            return
        gaps = cause_gaps(con, run_id, m, self.cause)
        n = len(s.work)
        s.work = _minus(s.work, gaps[:n])
        s.tail = _minus(s.tail, gaps[n:])

    def assumption(self):
        if self.cause:
            return (f"{self.text}: the device idle time caused by {self.cause} (idle_segments, idle.sql)"
                    + (" and, on CPU traces, the data-loading ranges" if self.cause == "data_loading" else "")
                    + " are removed from every work segment of every rank; the rest as measured")
        return ("no-host-gaps: device idle between kernels (launch gaps, syncs, GC, data loading, Python) and, on CPU "
                "traces, data-loading ranges are removed from every work segment; ranks without events keep theirs")


class BalancedStages(Part):
    text = "balanced-stages"

    def __init__(self):
        self.stage: int | None = None
        self.factor = 1.0
        self.ranks: set[int] = set()
        self.unmatched = 0

    def prepare(self, con, run_id):
        has = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
        if not {"bubbles_runs", "bubbles_stages"} <= has:
            return
        row = con.execute("""SELECT slowest_stage, slowest_busy_ns, median_other_busy_ns FROM bubbles_runs
                             WHERE run_id = ?""", [run_id]).fetchone()
        if not row or row[0] is None or not row[1] or row[2] is None:
            return
        self.stage, self.factor = int(row[0]), min(row[2] / row[1], 1.0)
        self.ranks = {r for (r,) in con.execute("SELECT DISTINCT rank FROM bubbles_stages WHERE run_id = ? AND stage = ?",
                                                [run_id, self.stage]).fetchall()}
        self.unmatched = con.execute("""SELECT count(*) FROM match_instances WHERE run_id = ? AND op = 'p2p'
                                        AND status <> 'complete'""", [run_id]).fetchone()[0] if "match_instances" in has else 0

    def apply(self, con, run_id, m, s):
        if not self.ranks or self.factor >= 1.0:
            return
        mine = np.isin(m.g.span_rank, list(self.ranks))
        rows = mine[m.g.row_span]
        # the stage's own work shrinks to the other stages' median; waiting and transfers stay
        s.work = np.where(rows & (s.work > 0), np.round(s.work * self.factor).astype(np.int64), s.work)
        s.tail = np.where(mine & (s.tail > 0), np.round(s.tail * self.factor).astype(np.int64), s.tail)

    def assumption(self):
        if not self.ranks:
            return "balanced-stages: no pipeline stage is heavier than the others (bubbles_runs): nothing changes"
        text = (f"balanced-stages: pipeline stage {self.stage} (ranks {sorted(self.ranks)}) does its work between "
                f"collectives x {self.factor:.3f}, the other stages' median own work over its own (bubbles_runs); "
                "waiting, transfers and the other stages as measured")
        if self.unmatched:
            text += (f"; {self.unmatched} send/recv instances are not matched across ranks (match_instances): the "
                     "stage's change cannot reach the stages it sends to through them, so the prediction is a bound "
                     "from below on what balancing buys")
        return text


class FreeComm(Part):
    """`free-comm:DIM`: the transfers of one parallel dimension's collectives cost nothing."""

    def __init__(self, dim: str):
        self.dim = dim
        self.text = f"free-comm:{dim}"

    def apply(self, con, run_id, m, s):
        mine = np.array([d == self.dim for d in m.dim], dtype=bool)[m.g.instance] if len(m.dim) else np.zeros(0, bool)
        # a negative exit (a member that left before the last arrival: an asynchronous send) stays
        s.exit_after = np.where(mine & (s.exit_after > 0), 0, s.exit_after)

    def assumption(self):
        return (f"{self.text}: each member of a {self.dim} collective (breakdown_groups.dim) leaves it as the last "
                "member arrives (its transfer free); waiting for the last peer and everything else as measured")


# A collective of at most this many bytes per rank is latency-bound on every link bprof knows of
# (NCCL's low-latency protocols carry messages up to about 64 KiB): batching such calls saves their
# latency, not bandwidth.
SMALL_COLLECTIVE_BYTES = 65536
NOT_BATCHED_OPS = ("p2p", "send", "recv", "barrier")


class CoalesceSmall(Part):
    """`coalesce-small[:BYTES]`: back-to-back small collectives of one group and op sent as one."""

    def __init__(self, max_bytes: int = SMALL_COLLECTIVE_BYTES):
        self.max_bytes = max_bytes
        self.text = "coalesce-small" if max_bytes == SMALL_COLLECTIVE_BYTES else f"coalesce-small:{max_bytes}"

    def apply(self, con, run_id, m, s):
        folded, continues = self.batches(m, s.work, s.exit_after)
        g = m.g
        # a folded call costs nothing: its transfer goes, and so does the host's call overhead
        # between it and the call it is folded into
        s.exit_after = np.where(folded[g.instance] & (s.exit_after > 0), 0, s.exit_after)
        after_folded = np.zeros(len(g.instance), dtype=bool)
        after_folded[1:] = continues & folded[g.instance[:-1]]
        s.work = np.where(after_folded, 0, s.work)

    def freed(self, m: StepModel, work: np.ndarray, exit_after: np.ndarray) -> np.ndarray:
        """Per dense instance: whether it is folded into the next call of its batch."""
        return self.batches(m, work, exit_after)[0]

    def batches(self, m: StepModel, work: np.ndarray, exit_after: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(per dense instance: folded into the next call of its batch; per member row after the
        first: it continues its rank's previous row's batch). A row continues it when both
        instances are small, of one group (instance_id >> 36, match.sql) and op, and the compute
        between them (the row's work less its host gaps: Python, the call's own overhead and
        waiting on the host are no compute) is at most the previous instance's transfer (its
        members' longest exit after the last arrival): the calls dominate (values averaged one by
        one, not the layers between a tensor-parallel all-reduce and the next). The whole work,
        not the compute, would break a storm wherever Python's call overhead is about one small
        transfer: on 2 gloo ranks, 20-350 us of work between two scalar all-reduces of 100-700 us,
        of which 12-40 us were ops. An instance is folded into its successor when the successor
        continues the batch on every member's rank."""
        g = m.g
        small = (m.bytes >= 0) & (m.bytes <= self.max_bytes) & ~np.isin(m.op.astype(str), NOT_BATCHED_OPS)
        none = np.zeros(max(len(g.instance) - 1, 0), dtype=bool)
        if small.sum() < 2:
            return np.zeros(len(small), dtype=bool), none
        key = np.where(small, g.instance_ids >> 36, -1)
        transfer = np.zeros(len(small), dtype=np.int64)
        np.maximum.at(transfer, g.instance, np.maximum(exit_after, 0))
        inst, prev = g.instance[1:], g.instance[:-1]
        ops = m.op.astype(str)
        compute = np.maximum(work - m.host_ns, 0)  # as perfect-overlap reads it
        continues = ((g.rank[1:] == g.rank[:-1]) & small[inst] & small[prev] & (key[inst] == key[prev])
                     & (ops[inst] == ops[prev]) & (compute[1:] <= transfer[prev]))
        # row r (r < last) is folded into row r + 1 when row r + 1 continues the batch
        folded_rows = np.zeros(len(g.instance), dtype=np.int64)
        folded_rows[:-1] = continues
        rows = np.bincount(g.instance, minlength=len(small))
        folded = (np.bincount(g.instance, weights=folded_rows, minlength=len(small)) == rows) & (rows > 0) & small
        return folded, continues

    def assumption(self):
        return (f"{self.text}: back-to-back collectives of at most {self.max_bytes} bytes of one group and op (the "
                "compute between two, their work less its host gaps, at most the first's transfer) are sent as one: each but the last costs nothing (no "
                "transfer, no host work before the next), the last keeps its transfer; the delay from each call to its "
                "start on the worker and waiting for the last peer as measured")


class PerfectOverlap(Part):
    text = "perfect-overlap"

    def apply(self, con, run_id, m, s):
        compute = np.maximum(s.work - m.host_ns, 0)
        # a negative exit (the member left before the last arrival: an asynchronous send) has no
        # transfer to hide and stays; raising it to 0 would lengthen the step
        s.exit_after = np.where(s.exit_after >= 0, np.maximum(s.exit_after - compute, 0), s.exit_after)

    def assumption(self):
        return ("perfect-overlap: each collective's transfer runs behind the compute of the work before it; a member "
                "leaves max(0, transfer - that compute) after the last peer arrived; waiting for the last peer stays")


@dataclasses.dataclass
class Scale(Part):
    target: str
    factor: float
    names: list[str] = dataclasses.field(default_factory=list)
    is_class: bool = False
    model: str = "auto"  # "auto": the device graph on ranks with kernels; "segment": the segment model everywhere
    has_kernels: bool = False
    device_ranks: set = dataclasses.field(default_factory=set)
    segment_ranks: set = dataclasses.field(default_factory=set)
    replayed: dict = dataclasses.field(default_factory=dict)  # rank -> device graph shifts (None: no GPU work)
    before: list = dataclasses.field(default_factory=list)  # the scale parts before this one in its scenario

    @property
    def text(self):
        return f"scale:{self.target}={self.factor:g}"

    def prepare(self, con, run_id):
        self.is_class = self.target in FINE_CLASSES
        self.device_ranks, self.segment_ranks, self.replayed = set(), set(), {}
        self.has_kernels = self.model == "auto" and self.factor != 1.0 and device_graph.prepare(con, run_id)
        if self.is_class:
            pairs = con.execute("SELECT DISTINCT name, kind FROM events WHERE run_id = ? AND kind IN ('kernel', 'cpu_op') "
                                "AND name IS NOT NULL", [run_id]).fetchall()
            self.names = sorted({name for name, _, fine, _, _ in classify_many(pairs) if fine == self.target})
            return
        self.names = [self.target]
        any_events = con.execute("SELECT count(*) FROM (SELECT 1 FROM events WHERE run_id = ? LIMIT 1)", [run_id]).fetchone()[0]
        found = con.execute("SELECT count(*) FROM (SELECT 1 FROM events WHERE run_id = ? AND name = ? LIMIT 1)",
                            [run_id, self.target]).fetchone()[0]
        if any_events and not found:
            raise UsageError(f"scenario {self.text!r}: {self.target!r} is neither a kernel class "
                             f"({', '.join(FINE_CLASSES)}) nor the name of a kernel or op of this run")

    def apply(self, con, run_id, m, s):
        if self.factor == 1.0:
            return  # the identity, exactly
        n = len(s.work)
        rank, lo, hi = m.segments()
        graphs = {}
        if self.has_kernels:
            for r, has in zip(m.g.span_rank.tolist(), m.has_events.tolist()):
                shifts = self._shifts(con, run_id, r) if has else None
                if shifts is not None:
                    graphs[r] = shifts
        delta = np.zeros(len(rank), dtype=np.int64)
        on_device = np.isin(rank, list(graphs))
        if graphs:
            by_rank = np.argsort(rank, kind="stable")
            cuts = np.flatnonzero(np.r_[True, rank[by_rank][1:] != rank[by_rank][:-1], True])
            for a, b in zip(cuts[:-1], cuts[1:]):
                idx = by_rank[a:b]
                shifts = graphs.get(int(rank[idx[0]]))
                if shifts is not None:
                    after, before = shifts
                    delta[idx] = after.at(hi[idx]) - after.at(lo[idx])
                    if before is not None:
                        delta[idx] -= before.at(hi[idx]) - before.at(lo[idx])
        self.device_ranks |= set(graphs)
        segment = set(m.g.span_rank[m.has_events].tolist()) - set(graphs)
        self.segment_ranks |= segment
        if segment:
            t = matched_time(con, run_id, m, self.names)
            old = np.rint((self.factor - 1.0) * t).astype(np.int64)
        else:
            old = np.zeros(len(rank), dtype=np.int64)
        # the device graph's shifts hold for any segment (a negative one too: asynchronous collectives)
        s.work = np.where(on_device[:n], s.work + delta[:n], _plus(s.work, old[:n]))
        s.tail = np.where(on_device[n:], s.tail + delta[n:], _plus(s.tail, old[n:]))

    def _shifts(self, con, run_id: int, rank: int):
        """The rank's device graph replayed (once per run) with the scale parts before this one in the
        scenario and with this one too: the shifts of both (None for the first without parts before),
        so that the parts' changes add up to one replay with all of them; None without GPU work."""
        if rank not in self.replayed:
            dg = device_graph.cached_graph(con, run_id, rank)
            if dg is None:
                self.replayed[rank] = None
            else:
                w = dg.weight_ns
                # a class names kernels (its catalogue names); a kernel or op name also the kernels an op launched
                for q in self.before:
                    w = dg.weights(dg.matching(q.names, not q.is_class), q.factor, w)
                before = dg.shifts(dg.replay(w)) if self.before else None
                mine = dg.matching(self.names, not self.is_class)
                self.replayed[rank] = (dg.shifts(dg.replay(dg.weights(mine, self.factor, w))), before)
        return self.replayed[rank]

    def assumption(self):
        what = f"kernel class {self.target} ({len(self.names)} names)" if self.is_class else f"the kernel or op {self.target}"
        text = f"{self.text}: the GPU work of {what} x {self.factor:g}"
        if self.factor == 1.0:
            return text + ": the identity, nothing replayed"
        if self.device_ranks:
            text += (f"; ranks {_ranks(self.device_ranks)} (with kernels): each work segment moves as the rank's "
                     "launch-level graph of its captured steps replays it (CUDA calls per thread, launches, stream "
                     "order, device-wide host syncs, calls blocked until GPU work ended, waits between streams inferred "
                     "where the rank calls cudaStreamWaitEvent, measured slack kept; bprof/whatif/device_graph.py)")
        if self.segment_ranks or not self.device_ranks:
            who = f"ranks {_ranks(self.segment_ranks)}" if self.segment_ranks else "ranks"
            text += (f"; {who} without kernels: X's time in each work segment (its kernels, or its ops on the main "
                     "thread on CPU) x the factor, assumed on the rank's critical path")
        return text + "; ranks without events unchanged"


def segment_model_steps(con: duckdb.DuckDBPyConnection, run_id: int, parts: list[Scale]) -> list[int]:
    """Each step's job time predicted with scale `parts` on the segment model everywhere (X's time in
    each work segment x F, as scale:X=F did before the device graph): what the device graph's tests
    and benchmark compare it with."""
    from bprof.whatif import graph
    from bprof.whatif.engine import replay

    for part in parts:
        part.model = "segment"
        part.prepare(con, run_id)
    out = []
    for m in graph.steps(con, run_id):
        s = State.measured(m)
        for part in parts:
            part.apply(con, run_id, m, s)
        r = replay(m.g, s.work, s.tail, s.exit_after)
        out.append(int((r.end_ns + s.end_delta - m.g.span_start_ns).max()))
    return out


def _ranks(ranks: set) -> str:
    r = sorted(ranks)
    return str(r) if len(r) <= 8 else f"{r[:4]}...{r[-2:]} ({len(r)})"


@dataclasses.dataclass
class CollectiveModel(Part):
    bw_gbps: float
    lat_us: float
    algo: str = "ring"

    @property
    def text(self):
        return f"coll:bw={self.bw_gbps:g},lat={self.lat_us:g},algo={self.algo}"

    def apply(self, con, run_id, m, s):
        t = collective_ns(m.op, m.bytes, m.group_size, self.bw_gbps * 1e9, self.lat_us * 1e-6, self.algo)
        per_row = t[m.g.instance]
        known = per_row >= 0
        s.exit_after = np.where(known, per_row, s.exit_after)

    def assumption(self):
        return (f"{self.text}: every collective's transfer after its last arrival is the alpha-beta time at "
                f"{self.bw_gbps:g} GB/s and {self.lat_us:g} us per hop ({self.algo}; formulas in bprof/whatif/scenarios.py); "
                f"instances of unknown size keep their measured transfer")


@dataclasses.dataclass
class DataParallel(Part):
    size: int
    link: CollectiveModel | None = None  # a coll: part of the same scenario: its link, not a fit
    fits: list = dataclasses.field(default_factory=list)  # per step: (degree, latency s, s per byte, how)

    @property
    def text(self):
        return f"dp={self.size}"

    def prepare(self, con, run_id):
        found = con.execute(f"""SELECT count(*) FROM breakdown_groups WHERE run_id = ? AND group_size > 1
                                AND dim IN ({", ".join("?" * len(DP_DIMS))})""", [run_id, *DP_DIMS]).fetchone()[0]
        if not found:
            raise UsageError(f"scenario {self.text!r}: run {run_id} has no data-parallel group ({', '.join(DP_DIMS)} "
                             "in breakdown_groups) to scale out")

    def apply(self, con, run_id, m, s):
        g = m.g
        dp = np.array([d in DP_DIMS for d in m.dim.tolist()], dtype=bool)
        known = np.flatnonzero(dp & (m.bytes >= 0) & (m.group_size > 1))
        if not len(known):
            return
        degree = int(m.group_size[known].max())
        n_old = m.group_size[known]
        n_new = np.maximum(np.rint(n_old * self.size / degree), 1).astype(np.int64)
        ops, sizes = m.op[known], m.bytes[known]
        if self.link is not None:
            latency, per_byte, algo = self.link.lat_us * 1e-6, 1 / (self.link.bw_gbps * 1e9), self.link.algo
            how = f"from {self.link.text}"
        else:
            transfer = np.array([np.median(s.exit_after[g.members(k)]) for k in known.tolist()])
            latency, per_byte, how = scaleout.fit(ops, sizes, n_old, transfer)
            algo = "ring"
        self.fits.append((degree, latency, per_byte, how))
        delta = np.zeros(len(m.op))
        for j, (o, b, a, z) in enumerate(zip(ops.tolist(), sizes.tolist(), n_old.tolist(), n_new.tolist())):
            delta[known[j]] = (scaleout.model_ns(o, b, z, latency, per_byte, algo)
                               - scaleout.model_ns(o, b, a, latency, per_byte, algo))
        per_row = np.rint(delta[g.instance]).astype(np.int64)
        # a negative exit (left before the last arrival) is no transfer: it stays, as in perfect-overlap
        s.exit_after = np.where((per_row != 0) & (s.exit_after >= 0), np.maximum(s.exit_after + per_row, 0), s.exit_after)

    def assumption(self):
        if self.fits:
            degree, latency, per_byte, how = self.fits[0]
            link = (f"latency {latency * 1e6:.3g} us per hop, bandwidth "
                    f"{(1 / per_byte / 1e9 if per_byte else float('inf')):.3g} GB/s ({how}; first step)")
        else:
            degree, link = None, "no data-parallel collective of known size in the analysed steps: nothing changes"
        return (f"{self.text}: data-parallel groups (dp, fsdp) of the run's {degree} ranks grow to {self.size} (weak scaling: "
                f"each rank's work as measured, the global batch {self.size}/{degree} x; MFU per GPU); each of their "
                f"collectives takes its measured transfer + the alpha-beta model's change for the larger group (ring; "
                f"bprof/whatif/scaleout.py), {link}; the added ranks work like the measured ones")


@dataclasses.dataclass
class MicroBatches(Part):
    num_microbatches: int
    pipe: Pipeline | None = None
    busy: dict = dataclasses.field(default_factory=dict)  # step -> rank -> bubbles_stages.span_ns - bubble_ns
    steps_unmodelled: int = 0
    unmatched_transfer: bool = False
    late = True

    @property
    def text(self):
        return f"microbatches={self.num_microbatches}"

    def prepare(self, con, run_id):
        self.pipe = Pipeline.of_run(con, run_id, self.text)
        if self.pipe.schedule == "interleaved-1f1b" and self.num_microbatches % self.pipe.num_stages:
            raise UsageError(f"scenario {self.text!r}: interleaved 1F1B needs micro-batches divisible by the run's "
                             f"{self.pipe.num_stages} stages (as Megatron)")
        self.busy = {}
        for rank, step, busy in con.execute("SELECT rank, step, span_ns - bubble_ns FROM bubbles_stages WHERE run_id = ?", [run_id]).fetchall():
            self.busy.setdefault(step, {})[rank] = busy

    def work_factor(self):
        return self.num_microbatches / self.pipe.num_microbatches if self.pipe else 1.0

    def apply(self, con, run_id, m, s):
        t = stage_times(m, self.pipe, self.busy.get(m.step, {}), s.work, s.exit_after)
        if t is None:
            self.steps_unmodelled += 1
            return
        self.unmatched_transfer |= bool((t.transfer_ns == 0).any())
        delta = stage_ends(t, self.pipe.schedule, self.num_microbatches) - stage_ends(t, self.pipe.schedule, self.pipe.num_microbatches)
        in_pipe = (m.stage >= 0) & (m.stage < len(delta))
        s.end_delta = s.end_delta + np.where(in_pipe, delta[np.clip(m.stage, 0, len(delta) - 1)], 0)

    def assumption(self):
        p = self.pipe
        schedule = p.schedule if p.schedule_known else "1f1b (assumed: its send/recv calls do not tell 1F1B from GPipe)"
        unit, per = ("a micro-batch's forward + backward", "the micro-batches in it") if p.num_chunks == 1 else (
            f"one model chunk's forward + backward of a micro-batch ({p.num_chunks} chunks per stage)",
            f"the {p.num_chunks} x micro-batches chunk passes in it")
        text = (f"{self.text}: the run's {schedule} pipeline of {p.num_stages} stages with {p.num_microbatches} "
                f"micro-batches of the same size; per stage, {unit} = its busy time (the step "
                f"less exposed send/recv) between its first and last send/recv / {per}, split 1:2, "
                f"recv transfer the median of its matched recvs, the work before and after (data loading, optimizer, "
                f"gradient sync) as measured; "
                f"sends do not hold their sender; each rank's step changes by its stage's change in that model replayed "
                f"with {p.num_microbatches} and {self.num_microbatches} micro-batches (bprof/whatif/pipeline.py); "
                f"applied after the other parts")
        if self.unmatched_transfer:
            text += "; a stage without a matched recv (solo send/recv calls) has its transfers at 0"
        if self.steps_unmodelled:
            text += f"; {self.steps_unmodelled} steps without send/recv on every stage unchanged"
        return text


_RING_STEPS = {"all_reduce": (2.0, 2.0), "all_gather": (1.0, 1.0), "reduce_scatter": (1.0, 1.0), "all_to_all": (1.0, 1.0),
               "gather": (1.0, 1.0), "scatter": (1.0, 1.0)}


def collective_ns(op: np.ndarray, size_bytes: np.ndarray, n: np.ndarray, bytes_per_s: float, latency_s: float,
                  algo: str) -> np.ndarray:
    """Alpha-beta time (ns) per instance; -1 where the size is unknown (barrier: latency only)."""
    out = np.full(len(op), -1, dtype=np.int64)
    for k, (name, size, group) in enumerate(zip(op.tolist(), size_bytes.tolist(), n.tolist())):
        group = max(int(group), 1)
        if group == 1:
            out[k] = 0
            continue
        if name == "barrier":
            out[k] = round(2 * (group - 1) * latency_s * 1e9)
            continue
        if size < 0:
            continue
        log_n = math.ceil(math.log2(group))
        if algo == "tree" and name == "all_reduce":
            sec = 2 * log_n * latency_s + 2 * (group - 1) / group * size / bytes_per_s
        elif algo == "tree" and name in ("broadcast", "reduce"):
            sec = log_n * latency_s + size / bytes_per_s
        elif name in _RING_STEPS:
            a, b = _RING_STEPS[name]
            sec = a * (group - 1) * latency_s + b * (group - 1) / group * size / bytes_per_s
        elif name in ("broadcast", "reduce"):
            sec = (group - 1) * latency_s + size / bytes_per_s
        else:  # p2p, send, recv, send_recv, unknown: one hop
            sec = latency_s + size / bytes_per_s
        out[k] = round(sec * 1e9)
    return out


def _minus(values: np.ndarray, part: np.ndarray) -> np.ndarray:
    """values - part where values are positive, never below 0 (a negative segment - asynchronous
    collectives - has no parts and stays)."""
    return np.where(values > 0, np.maximum(values - part, 0), values)


def _plus(values: np.ndarray, delta: np.ndarray) -> np.ndarray:
    return np.where(values > 0, np.maximum(values + delta, 0), values)


_NUMBER = r"[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?"


def parse(text: str) -> list[Part]:
    """A scenario string -> its parts, in order; a usage error naming the part that is wrong."""
    parts = [p.strip() for p in text.split("+")]
    if not text.strip() or any(not p for p in parts):
        raise UsageError(f"scenario {text!r}: empty part (parts are joined by '+')")
    out = [_part(p) for p in parts]
    for i, p in enumerate(out):
        if isinstance(p, Scale):  # on the device graph, a scale part replays with the ones before it
            p.before = [q for q in out[:i] if isinstance(q, Scale)]
    links = [p for p in out if isinstance(p, CollectiveModel)]
    for p in out:
        if isinstance(p, DataParallel) and links:
            p.link = links[-1]
    return out


def _part(p: str) -> Part:
    simple = {"no-stragglers": NoStragglers, "no-host-gaps": NoHostGaps, "perfect-overlap": PerfectOverlap,
              "balanced-stages": BalancedStages}
    if p in simple:
        return simple[p]()
    if p.startswith("free-comm:"):
        dim = p[len("free-comm:"):]
        if not re.fullmatch(r"[a-z_]+", dim):
            raise UsageError(f"scenario {p!r}: expected free-comm:<dimension>, e.g. free-comm:dp")
        return FreeComm(dim)
    if p == "coalesce-small" or p.startswith("coalesce-small:"):
        size = p[len("coalesce-small:"):] if ":" in p else str(SMALL_COLLECTIVE_BYTES)
        if not re.fullmatch(r"[0-9]+", size) or int(size) < 1:
            raise UsageError(f"scenario {p!r}: expected coalesce-small[:<bytes per rank, 1 or more>], e.g. coalesce-small:65536")
        return CoalesceSmall(int(size))
    if p.startswith("no-host-gaps:"):
        cause = p[len("no-host-gaps:"):]
        if cause not in HOST_CAUSES:
            raise UsageError(f"scenario {p!r}: the cause must be one of {', '.join(HOST_CAUSES)}")
        return NoHostGaps(cause)
    if p.startswith("scale:"):
        target, eq, factor = p[len("scale:"):].rpartition("=")
        if not eq or not target:
            raise UsageError(f"scenario {p!r}: expected scale:<kernel class or op name>=<factor>, e.g. scale:gemm=0.8")
        if not re.fullmatch(_NUMBER, factor) or float(factor) <= 0:
            raise UsageError(f"scenario {p!r}: the factor must be a number above 0, got {factor!r}")
        return Scale(target, float(factor))
    if p.startswith("coll:"):
        fields = dict(kv.partition("=")[::2] for kv in p[len("coll:"):].split(","))
        unknown = set(fields) - {"bw", "lat", "algo"}
        if unknown or "bw" not in fields or "lat" not in fields:
            raise UsageError(f"scenario {p!r}: expected coll:bw=<GB/s>,lat=<us>[,algo=ring|tree]")
        for key in ("bw", "lat"):
            if not re.fullmatch(_NUMBER, fields[key]):
                raise UsageError(f"scenario {p!r}: {key} must be a number, got {fields[key]!r}")
        if float(fields["bw"]) <= 0:
            raise UsageError(f"scenario {p!r}: bw must be above 0")
        algo = fields.get("algo", "ring")
        if algo not in ("ring", "tree"):
            raise UsageError(f"scenario {p!r}: algo must be ring or tree, got {algo!r}")
        return CollectiveModel(float(fields["bw"]), float(fields["lat"]), algo)
    if p.startswith("dp=") or p == "dp":
        count = p[len("dp="):]
        if not re.fullmatch(r"[0-9]+", count) or int(count) < 1:
            raise UsageError(f"scenario {p!r}: expected dp=<data-parallel ranks, 1 or more>, e.g. dp=64")
        return DataParallel(int(count))
    if p.startswith("microbatches"):
        _, eq, count = p.partition("=")
        if not eq or not re.fullmatch(r"[0-9]+", count) or int(count) < 1:
            raise UsageError(f"scenario {p!r}: expected microbatches=<count of 1 or more>, e.g. microbatches=8")
        return MicroBatches(int(count))
    raise UsageError(f"unknown scenario {p!r}: expected no-stragglers, no-host-gaps, perfect-overlap, coalesce-small, "
                     "scale:<class or op>=<factor>, coll:bw=<GB/s>,lat=<us>[,algo=ring|tree], microbatches=<M> or dp=<N>")
