"""A rank's captured steps on a GPU trace as a launch-level dependency graph, replayed with some
kernels faster or slower: what `scale:X=F` buys when the host, not the GPU, may be what a step
waits for.

Nodes are time points: the start and the end of every CUDA/HIP runtime or driver call (per host
thread, in order), of every kernel, memcpy and memset (per device and stream, in order), each
step's start and end (its timeline_spans span: on the device where the step launched device work)
and each step's start on the host (timeline_spans.host_ts_ns, its ProfilerStep range). A time
point is the latest of its predecessors (each plus the edge's weight) plus its own delay:

- thread order: a call starts after the previous call of its thread ended;
- a call ends its duration after it started; a kernel/memcpy/memset likewise (the weight a scale
  changes);
- launch: GPU work starts after the start of the call with its correlation id (the call may return
  before or after it starts);
- stream order: GPU work starts after the previous work of its (device, stream) ended;
- host syncs (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, their hip and
  driver forms): the call ends after the GPU work it waits for ended. The traces do not say which
  stream or event, so it is device-wide: the last work of every stream launched before the call
  started. A synchronous copy (cudaMemcpy, hipMemcpyWithStream, ...) waits for its own copy;
- blocked calls: a call that took over max(50 us, 4 x the median of its name on the rank) while
  GPU work ended, and is no sync (a launch into a full launch queue, a copy to pageable memory, an
  allocation that synchronises), costs the median of its name and otherwise waits for the GPU
  work that ended last before it returned;
- a step starts after the previous step ended (when consecutive: the spans tile the timeline);
  its calls start after its start on the host, which follows the previous step's last call of
  each training thread (when consecutive); its GPU work follows its launches and streams only.
  Where the device lags, the device span starts milliseconds after the host's calls of the step,
  and GPU work on a second stream (copies, input preparation) starts before the previous step's
  device work ended: anchoring either to the span start contradicted the measurement (6,710 such
  edges dropped on one A100 trace, 10,870 on a V100 one) and let a queue-bound step gain;
  a step ends after the last call of each training thread
  (timeline_threads) of the step ended and, when its span ends with the device (the last step),
  after the last work of each stream ended.

A time point's delay is its measured slack: measured time - the latest of its predecessors'
measured times (plus weights); so the unchanged replay reproduces every measured time exactly
(tested on every GPU trace of ../shared). A dependency the measurement contradicts (a predecessor
later than the node: a device-wide sync that did not wait for a stream, overlapping calls) is left
out and counted in `dropped`. Edges the traces cannot show (cudaStreamWaitEvent between streams:
its event and streams are not recorded) are inferred: on a rank that calls cudaStreamWaitEvent,
GPU work that started later than its launch and stream order allow starts after the work of
another stream of its device that ended last before it, when that ended in between (an NCCL
kernel waiting for the compute stream, compute waiting for a collective's result); work with
neither its launch nor a stream predecessor in the window (launched before the capture) stays at
its measured time.

The graph spans all captured steps of the rank, because the GPU can run a step behind the host:
the launches of step s wait for step s-1's kernels. Time points before the window (the work of
uncaptured steps) are as measured.

Reads _dg_events (device_graph.sql) and timeline_spans; no torch. The replay is a walk in
topological order (numba).
"""

from __future__ import annotations

import dataclasses
import re

import duckdb
import numba
import numpy as np

from bprof.store.sqlfile import run_sql_file

# host calls that return only when GPU work has ended: device-wide (the trace does not say which
# stream or event they wait for) ...
_SYNC = re.compile(r"^(cuda|hip)(Device|Stream|Event)Synchronize$|^cu(Ctx|Stream|Event)Synchronize$")
# ... and synchronous copies, which wait for their own copy (their stream is the copy's)
_SYNC_COPY = re.compile(r"^(cuda|hip)Memcpy(2D|3D|Peer|ToSymbol|FromSymbol)?$|^hipMemcpyWithStream$"
                        r"|^cuMemcpy(HtoD|DtoH|DtoD|Peer)?(_v2)?$")
BLOCKED_MIN_NS = 50_000  # a call is blocked when it took longer than this ...
BLOCKED_X_MEDIAN = 4  # ... and than this many times the median of its name on the rank

_WAIT_EVENT = re.compile(r"^(cuda|hip|cu)StreamWaitEvent$")

EDGE_KINDS = ("thread", "call", "gpu", "launch", "stream", "sync", "blocked", "step", "end", "event")
_THREAD, _CALL, _GPU, _LAUNCH, _STREAM, _SYNC_EDGE, _BLOCKED, _STEP, _END, _EVENT = range(len(EDGE_KINDS))
_NONE = np.iinfo(np.int64).min // 4  # no lower bound


@dataclasses.dataclass(frozen=True)
class DeviceGraph:
    """One rank's captured steps. Op i (a call or GPU work) has time points 2i (start) and 2i+1
    (end); then each step's end (2n + k), start (2n + K + k) and start on the host (2n + 2K + k),
    k indexing `steps`. Edges are in CSR by destination (ptr, src, weight_ns)."""

    rank: int
    steps: np.ndarray  # the rank's steps, ascending
    op_step: np.ndarray  # per op: index into steps
    names: np.ndarray  # per op: its name (object)
    op_names: np.ndarray  # per op: the CPU op that launched it (object; None when unknown)
    is_host: np.ndarray  # per op: a runtime/driver call (else kernel, memcpy or memset)
    blocked: np.ndarray  # per op: a call that waited for GPU work (not a sync)
    measured_ns: np.ndarray  # per time point, own clock
    ext_ns: np.ndarray  # per time point: its lower bound that is no node (its measured time when it has no predecessor)
    delay_ns: np.ndarray  # per time point: measured slack over its latest predecessor
    ptr: np.ndarray
    src: np.ndarray
    weight_ns: np.ndarray
    gpu_edge: np.ndarray  # per op: index of its start->end edge (GPU work: the weight a scale changes), else -1
    order: np.ndarray  # the time points in a topological order
    anchors: np.ndarray  # time points a segment boundary may be read at (GPU work, training calls, step starts and ends)
    dropped: dict  # edge kind -> count of measured-contradicted dependencies left out
    kept: dict  # edge kind -> count of edges in the graph

    @property
    def num_ops(self) -> int:
        return len(self.names)

    def end_point(self, k: int) -> int:
        return 2 * self.num_ops + k

    def start_point(self, k: int) -> int:
        return 2 * self.num_ops + len(self.steps) + k

    def host_start_point(self, k: int) -> int:
        return 2 * self.num_ops + 2 * len(self.steps) + k

    @property
    def num_gpu_ops(self) -> int:
        return int((~self.is_host).sum())

    def matching(self, names, by_op: bool = True) -> np.ndarray:
        """Per op: GPU work whose own name, or (by_op) whose launching CPU op's name, is in `names`."""
        names = list(names)
        hit = np.isin(self.names, names)
        if by_op:
            hit |= np.isin(self.op_names, names)
        return hit & ~self.is_host

    def weights(self, scaled: np.ndarray | None = None, factor: float = 1.0, base_ns: np.ndarray | None = None) -> np.ndarray:
        """The edge weights (`base_ns`, default as measured) with the GPU work marked in `scaled` (per
        op) taking `factor` x its time."""
        w = (self.weight_ns if base_ns is None else base_ns).copy()
        if scaled is not None and factor != 1.0:
            e = self.gpu_edge[scaled & (self.gpu_edge >= 0)]
            w[e] = np.rint(w[e] * factor).astype(np.int64)
        return w

    def replay(self, weight_ns: np.ndarray | None = None) -> np.ndarray:
        """Every time point replayed with the given edge weights (default: as measured)."""
        w = self.weight_ns if weight_ns is None else weight_ns
        return _replay(self.order, self.ptr, self.src, w, self.ext_ns, self.delay_ns)

    def step_ns(self, replayed: np.ndarray) -> np.ndarray:
        """Each step's span (end - start) in a replay."""
        k = np.arange(len(self.steps))
        return replayed[self.end_point(k)] - replayed[self.start_point(k)]

    def shifts(self, replayed: np.ndarray) -> "Shifts":
        """The anchors' shifts in a replay, ready to be read at any time."""
        a = self.anchors
        shift = replayed[a] - self.measured_ns[a]
        by = np.lexsort((shift, self.measured_ns[a]))
        return Shifts(self.measured_ns[a][by], shift[by])

    def shift_at(self, at_ns: np.ndarray, replayed: np.ndarray) -> np.ndarray:
        return self.shifts(replayed).at(at_ns)


@dataclasses.dataclass(frozen=True)
class Shifts:
    measured_ns: np.ndarray  # anchors by measured time, then shift
    shift_ns: np.ndarray

    def at(self, at_ns) -> np.ndarray:
        """How far the replay moved each time `at_ns` (own clock): the shift of the latest anchor at or
        before it (of those tied, the largest: the least gain), 0 before the first."""
        j = np.searchsorted(self.measured_ns, np.asarray(at_ns, dtype=np.int64), side="right") - 1
        return np.where(j >= 0, self.shift_ns[np.maximum(j, 0)], 0)


def build(ev: dict, rank: int, steps, span_start_ns, span_end_ns, host_start_ns=None) -> DeviceGraph:
    """The graph of one rank from its _dg_events rows (arrays: step, is_host, name, op_name, tid,
    device, stream, ts_ns, dur_ns, correlation, training), its steps' spans and their starts on the
    host (own clock; default the span starts); rows of a step without a span are left out."""
    steps = np.asarray(steps, dtype=np.int64)
    by = np.argsort(steps)
    steps, span_start, span_end = steps[by], np.asarray(span_start_ns, dtype=np.int64)[by], np.asarray(span_end_ns, dtype=np.int64)[by]
    host_start = span_start if host_start_ns is None else np.asarray(host_start_ns, dtype=np.int64)[by]
    ev_step = np.asarray(ev["step"], dtype=np.int64)
    k_of = np.minimum(np.searchsorted(steps, ev_step), max(len(steps) - 1, 0))
    keep = (steps[k_of] == ev_step) if len(steps) else np.zeros(len(ev_step), dtype=bool)
    ev = {key: np.asarray(v)[keep] if not np.ma.isMaskedArray(v) else v[keep] for key, v in ev.items()}
    op_step = k_of[keep]
    ts = np.asarray(ev["ts_ns"], dtype=np.int64)
    dur = np.maximum(np.asarray(ev["dur_ns"], dtype=np.int64), 0)
    end = ts + dur
    n, K = len(ts), len(steps)
    host = np.asarray(ev["is_host"], dtype=bool)
    names = np.asarray(ev["name"], dtype=object)
    corr = _filled(ev["correlation"], -1)
    start_pt, end_pt = 2 * np.arange(n), 2 * np.arange(n) + 1
    step_end_pt, step_start_pt, host_start_pt = 2 * n + np.arange(K), 2 * n + K + np.arange(K), 2 * n + 2 * K + np.arange(K)
    measured = np.concatenate([np.column_stack([ts, end]).ravel(), span_end, span_start, host_start]).astype(np.int64)
    listed = names.tolist()
    sync = host & np.array([bool(x) and bool(_SYNC.match(x)) for x in listed], dtype=bool)
    sync_copy = host & np.array([bool(x) and bool(_SYNC_COPY.match(x)) for x in listed], dtype=bool)
    src, dst, w, kind = [], [], [], []

    def add(s, d, wt, k):
        s = np.asarray(s, dtype=np.int64)
        src.append(s)
        dst.append(np.asarray(d, dtype=np.int64))
        w.append(np.broadcast_to(np.asarray(wt, dtype=np.int64), s.shape))
        kind.append(np.full(s.shape, k, dtype=np.int8))

    h, g = np.flatnonzero(host), np.flatnonzero(~host)
    # GPU work: its duration (the scaled edge), its launch, its stream order
    add(start_pt[g], end_pt[g], dur[g], _GPU)
    launch = np.full(n, -1, dtype=np.int64)
    if len(h) and len(g):
        hc = h[np.argsort(corr[h], kind="stable")]
        at = np.minimum(np.searchsorted(corr[hc], corr[g]), len(hc) - 1)
        found = (corr[g] >= 0) & (corr[hc][at] == corr[g])
        launch[g[found]] = hc[at[found]]
    gl = g[launch[g] >= 0]
    add(start_pt[launch[gl]], start_pt[gl], 0, _LAUNCH)
    device, stream = _filled(ev["device"], -1), _filled(ev["stream"], -1)
    gs = g[np.lexsort((end[g], ts[g], stream[g], device[g]))]
    same_stream = (device[gs[1:]] == device[gs[:-1]]) & (stream[gs[1:]] == stream[gs[:-1]])
    add(end_pt[gs[:-1][same_stream]], start_pt[gs[1:][same_stream]], 0, _STREAM)
    # waits between streams (inferred): on a rank that calls cudaStreamWaitEvent, GPU work that
    # started later than its launch and its stream allow starts after the work of another stream of
    # its device that ended last before it, when that ended in between
    if len(g) and any(x and _WAIT_EVENT.match(x) for x in set(names[h].tolist())):
        allowed = np.full(n, _NONE)
        allowed[gl] = ts[launch[gl]]
        nxt = gs[1:][same_stream]
        allowed[nxt] = np.maximum(allowed[nxt], end[gs[:-1][same_stream]])
        best, best_end = np.full(n, -1, dtype=np.int64), np.full(n, _NONE)
        key = device * (1 << 32) + stream
        for k in np.unique(key[g]):
            on = g[key[g] == k]
            on = on[np.argsort(end[on], kind="stable")]
            other = g[(key[g] != k) & (device[g] == device[on[0]])]
            j = np.searchsorted(end[on], ts[other], side="right") - 1
            ok = j >= 0
            cand, cand_end = on[np.maximum(j, 0)], end[on[np.maximum(j, 0)]]
            better = ok & (cand_end > best_end[other])
            best[other[better]], best_end[other[better]] = cand[better], cand_end[better]
        # (work with neither a launch nor a stream predecessor in the window has nothing to compare)
        waits = g[(best[g] >= 0) & (allowed[g] > _NONE) & (best_end[g] > allowed[g])]
        add(end_pt[best[waits]], start_pt[waits], 0, _EVENT)
    # thread order; calls' durations: a sync's end is its waits', a blocked call's its median + its wait
    tid = np.unique(np.asarray(ev["tid"], dtype=object).astype(str), return_inverse=True)[1].astype(np.int64)
    hs = h[np.lexsort((end[h], ts[h], tid[h]))]
    same_thread = tid[hs[1:]] == tid[hs[:-1]]
    add(end_pt[hs[:-1][same_thread]], start_pt[hs[1:][same_thread]], 0, _THREAD)
    typical = _median_by_name(names, dur, h)
    blocked = np.zeros(n, dtype=bool)
    waited = np.full(n, -1, dtype=np.int64)
    if len(g):
        g_by_end = g[np.argsort(end[g], kind="stable")]
        j = np.searchsorted(end[g_by_end], end[h], side="right") - 1
        cand = (j >= 0) & (dur[h] > BLOCKED_MIN_NS) & (dur[h] > BLOCKED_X_MEDIAN * typical[h]) & ~sync[h] & ~sync_copy[h]
        cand &= end[g_by_end[np.maximum(j, 0)]] > ts[h]  # GPU work ended while the call waited
        blocked[h[cand]] = True
        waited[h[cand]] = g_by_end[j[cand]]
    own = np.where(sync[h] | sync_copy[h], 0, np.where(blocked[h], np.minimum(typical[h], dur[h]), dur[h]))
    add(start_pt[h], end_pt[h], own, _CALL)
    b = np.flatnonzero(blocked)
    add(end_pt[waited[b]], end_pt[b], 0, _BLOCKED)
    # host syncs: device-wide, the last work of each stream launched before the call started
    launched_ns = np.where(launch >= 0, ts[np.maximum(launch, 0)], ts)
    first = np.r_[True, ~same_stream] if len(gs) else np.zeros(0, dtype=bool)
    bounds = np.r_[np.flatnonzero(first), len(gs)]
    syncs = np.flatnonzero(sync)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if not len(syncs):
            break
        ops = gs[lo:hi]
        issued = np.maximum.accumulate(launched_ns[ops])
        j = np.searchsorted(issued, ts[syncs], side="left") - 1
        ok = j >= 0
        add(end_pt[ops[j[ok]]], end_pt[syncs[ok]], 0, _SYNC_EDGE)
    copies = gl[sync_copy[launch[gl]]]
    add(end_pt[copies], end_pt[launch[copies]], 0, _SYNC_EDGE)
    # steps: a consecutive step starts when the one before ended; its calls start after its start
    # on the host
    consecutive = np.flatnonzero((steps[1:] == steps[:-1] + 1) & (span_start[1:] == span_end[:-1])) + 1
    add(step_end_pt[consecutive - 1], step_start_pt[consecutive], 0, _STEP)
    add(host_start_pt[op_step[h]], start_pt[h], 0, _STEP)
    # a step ends after each training thread's last call of the step; after each stream's last work
    # of the step when its span ends with the device; the next step starts on the host after them
    training = np.asarray(ev["training"], dtype=bool) & host
    drivers = training if training.any() else host
    hk = h[np.lexsort((end[h], ts[h], tid[h], op_step[h]))]
    last = np.r_[(tid[hk[1:]] != tid[hk[:-1]]) | (op_step[hk[1:]] != op_step[hk[:-1]]), True] if len(hk) else np.zeros(0, dtype=bool)
    last_call = hk[last]
    last_call = last_call[drivers[last_call]]
    add(end_pt[last_call], step_end_pt[op_step[last_call]], 0, _END)
    k_next = np.minimum(op_step[last_call] + 1, max(K - 1, 0))
    follows = (op_step[last_call] + 1 < K) & (steps[k_next] == steps[op_step[last_call]] + 1)
    add(end_pt[last_call[follows]], host_start_pt[k_next[follows]], 0, _STEP)
    if len(g):
        gk = g[np.lexsort((end[g], ts[g], stream[g], device[g], op_step[g]))]
        new = np.r_[(op_step[gk[1:]] != op_step[gk[:-1]]) | (stream[gk[1:]] != stream[gk[:-1]])
                    | (device[gk[1:]] != device[gk[:-1]]), True]
        last_work = gk[new]
        step_gpu_end = np.full(K, _NONE)
        np.maximum.at(step_gpu_end, op_step[g], end[g])
        with_device = last_work[span_end[op_step[last_work]] == step_gpu_end[op_step[last_work]]]
        add(end_pt[with_device], step_end_pt[op_step[with_device]], 0, _END)

    src, dst, w, kind = (np.concatenate(x) for x in (src, dst, w, kind))
    held = measured[src] + w <= measured[dst]
    dropped = {EDGE_KINDS[k]: int(c) for k, c in zip(*np.unique(kind[~held], return_counts=True))}
    src, dst, w, kind = src[held], dst[held], w[held], kind[held]
    by = np.lexsort((src, dst))
    src, dst, w, kind = src[by], dst[by], w[by], kind[by]
    points = len(measured)
    ptr = np.zeros(points + 1, dtype=np.int64)
    np.add.at(ptr, dst + 1, 1)
    ptr = np.cumsum(ptr)
    ext = np.where(ptr[1:] == ptr[:-1], measured, _NONE)  # a time point with no predecessor is fixed
    bound = ext.copy()
    np.maximum.at(bound, dst, measured[src] + w)
    gpu_edge = np.full(n, -1, dtype=np.int64)
    is_gpu = kind == _GPU
    gpu_edge[dst[is_gpu] // 2] = np.flatnonzero(is_gpu)
    order = _topological(points, ptr, src)
    th = h[training[h]]
    anchors = np.r_[start_pt[g], end_pt[g], start_pt[th], end_pt[th], step_end_pt, step_start_pt, host_start_pt].astype(np.int64)
    kept = {EDGE_KINDS[k]: int(c) for k, c in zip(*np.unique(kind, return_counts=True))}
    return DeviceGraph(rank, steps, op_step, names, np.asarray(ev["op_name"], dtype=object), host, blocked, measured,
                       ext, measured - bound, ptr, src, w, gpu_edge, order, anchors, dropped, kept)


def _median_by_name(names: np.ndarray, dur: np.ndarray, calls: np.ndarray) -> np.ndarray:
    """Per op: the median duration of the calls (among `calls`) of its name; 0 for the others."""
    out = np.zeros(len(names), dtype=np.int64)
    if not len(calls):
        return out
    keys, inv = np.unique(names[calls].astype(str), return_inverse=True)
    by = np.lexsort((dur[calls], inv))
    ptr = np.r_[0, np.cumsum(np.bincount(inv, minlength=len(keys)))]
    sorted_dur = dur[calls][by]
    med = np.array([sorted_dur[(ptr[i] + ptr[i + 1] - 1) // 2] for i in range(len(keys))], dtype=np.int64)
    out[calls] = med[inv]
    return out


def _filled(column, value) -> np.ndarray:
    """A fetched BIGINT column as int64, `value` where NULL."""
    return np.ma.filled(np.ma.asarray(column).astype(np.int64), value) if np.ma.isMaskedArray(column) \
        else np.asarray(column, dtype=np.int64)


def prepare(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Load the run's launch-level events (_dg_events); False when the run has no kernels."""
    has = con.execute("SELECT count(*) FROM (SELECT 1 FROM events WHERE run_id = ? AND kind = 'kernel' LIMIT 1)",
                      [run_id]).fetchone()[0]
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    if not has or not {"timeline_threads", "timeline_spans"} <= tables:
        return False
    run_sql_file(con, "bprof.whatif", "device_graph.sql", {"run_id": run_id})
    _graphs.clear()
    return True


_graphs: dict = {}
CACHE_POINTS = 5_000_000  # time points of graphs kept for reuse (a 16-rank-step graph holds ~80,000)


def cached_graph(con: duckdb.DuckDBPyConnection, run_id: int, rank: int) -> DeviceGraph | None:
    """rank_graph(), kept for the run last asked while the kept graphs hold under CACHE_POINTS
    time points (several scale parts of one whatif replay the same graphs)."""
    key = (id(con), run_id)
    if _graphs.get("key") != key:
        _graphs.clear()
        _graphs.update(key=key, points=0)
    if rank in _graphs:
        return _graphs[rank]
    g = rank_graph(con, run_id, rank)
    size = 0 if g is None else len(g.measured_ns)
    if _graphs["points"] + size <= CACHE_POINTS:
        _graphs[rank] = g
        _graphs["points"] += size
    return g


_COLUMNS = "step, is_host, name, op_name, tid, device, stream, ts_ns, dur_ns, correlation, training"


def rank_graph(con: duckdb.DuckDBPyConnection, run_id: int, rank: int) -> DeviceGraph | None:
    """The graph of one rank's captured steps (prepare() first); None when it ran no GPU work."""
    spans = con.execute("""SELECT step, ts_ns, ts_ns + dur_ns AS end_ns, coalesce(host_ts_ns, ts_ns) AS host_ts_ns
                           FROM timeline_spans WHERE run_id = ? AND rank = ? ORDER BY step""", [run_id, rank]).fetchnumpy()
    rows = con.execute(f"SELECT {_COLUMNS} FROM _dg_events WHERE rank = ? ORDER BY ts_ns", [rank]).fetchnumpy()
    if not len(spans["step"]) or np.asarray(rows["is_host"], dtype=bool).all():
        return None
    ev = {k: _objects(v) if k in ("name", "op_name", "tid") else v for k, v in rows.items()}
    g = build(ev, rank, spans["step"], spans["ts_ns"], spans["end_ns"], spans["host_ts_ns"])
    return g if g.num_gpu_ops else None


def _objects(column) -> np.ndarray:
    mask = np.ma.getmaskarray(column)
    return np.where(mask, None, np.ma.getdata(column).astype(object))


@numba.njit(cache=True, nogil=True)
def _replay(order, ptr, src, w, ext, delay):  # pragma: no cover - compiled
    """Algorithm: max-plus over the DAG in topological order: each time point is the latest of its
    predecessors' replayed times plus the edges' weights (and its lower bound), plus its delay."""
    t = np.empty(len(ext), dtype=np.int64)
    for p in order:
        b = ext[p]
        for e in range(ptr[p], ptr[p + 1]):
            v = t[src[e]] + w[e]
            if v > b:
                b = v
        t[p] = b + delay[p]
    return t


@numba.njit(cache=True, nogil=True)
def _topological(n, ptr, src):  # pragma: no cover - compiled
    """Kahn's order of n time points from the predecessor CSR; raises on a cycle (kept edges hold
    measured times that never decrease along them, so a cycle could only join equal times)."""
    indeg = ptr[1:] - ptr[:-1]
    count = np.zeros(n + 1, dtype=np.int64)
    for e in range(len(src)):
        count[src[e] + 1] += 1
    for i in range(n):
        count[i + 1] += count[i]
    succ = np.empty(len(src), dtype=np.int64)
    fill = count[:-1].copy()
    for d in range(n):
        for e in range(ptr[d], ptr[d + 1]):
            succ[fill[src[e]]] = d
            fill[src[e]] += 1
    order = np.empty(n, dtype=np.int64)
    head = 0
    tail = 0
    left = indeg.copy()
    for i in range(n):
        if left[i] == 0:
            order[tail] = i
            tail += 1
    while head < tail:
        p = order[head]
        head += 1
        for k in range(count[p], count[p + 1]):
            d = succ[k]
            left[d] -= 1
            if left[d] == 0:
                order[tail] = d
                tail += 1
    if tail != n:
        raise ValueError("the device graph has a cycle")
    return order
