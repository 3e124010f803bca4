"""A rank's step on a GPU trace as a launch-level dependency graph, replayed with some kernels faster
or slower: what `scale:X=F` buys when the host, not the GPU, may be what the step waits for.

Nodes are time points: the start and the end of every CUDA/HIP runtime or driver call (per host
thread, in order), of every kernel, memcpy and memset (per device and stream, in order), and the end
of the step's span. A time point is the latest of its predecessors (each plus the edge's weight)
plus its own delay:

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
- the span ends after the last call of each training thread (timeline_threads) ended, and, when
  the span's end is the device's (the last step), after the last work of each stream ended.

A time point's delay is its measured slack: measured time - the latest of its predecessors'
measured times (plus weights), the step's start counting as one; so the unchanged replay
reproduces every measured time exactly (tested on every GPU trace of ../shared). A dependency the
measurement contradicts (a predecessor later than the node: a device-wide sync that did not wait
for a stream, nested calls) is left out and counted in `dropped`. Edges the traces cannot show
(cudaStreamWaitEvent between streams: its event and streams are not recorded) are not modelled:
the work after such a wait keeps its measured delay after its launch and stream predecessor.

Reads _dg_events (device_graph.sql); no torch. The replay is a walk in topological order (numba).
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

EDGE_KINDS = ("thread", "call", "gpu", "launch", "stream", "sync", "end")
_THREAD, _CALL, _GPU, _LAUNCH, _STREAM, _SYNC_EDGE, _END = range(len(EDGE_KINDS))


@dataclasses.dataclass(frozen=True)
class DeviceGraph:
    """One rank-step. Op i (a call or GPU work) has time points 2i (start) and 2i+1 (end); the
    span's end is the last time point. Edges are in CSR by destination (ptr, src, weight)."""

    rank: int
    step: int
    names: np.ndarray  # per op: its name (object)
    op_names: np.ndarray  # per op: the CPU op that launched it (object; None when unknown)
    is_host: np.ndarray  # per op: a runtime/driver call (else kernel, memcpy or memset)
    measured_ns: np.ndarray  # per time point, own clock
    ext_ns: np.ndarray  # per time point: the lower bound that is no node (the step's start)
    delay_ns: np.ndarray  # per time point: measured slack over its latest predecessor
    ptr: np.ndarray
    src: np.ndarray
    weight_ns: np.ndarray
    gpu_edge: np.ndarray  # per op: index of its start->end edge (GPU work: the weight a scale changes)
    order: np.ndarray  # the time points in a topological order
    anchors: np.ndarray  # time points a segment boundary may be read at (GPU work, training calls, span end)
    dropped: dict  # edge kind -> count of measured-contradicted dependencies left out

    @property
    def end_point(self) -> int:
        return len(self.measured_ns) - 1

    @property
    def num_gpu_ops(self) -> int:
        return int((~self.is_host).sum())

    def matching(self, names) -> np.ndarray:
        """Per op: GPU work whose own name, or whose launching CPU op's name, is in `names`."""
        names = list(names)
        hit = np.isin(self.names, names) | np.isin(self.op_names, names)
        return hit & ~self.is_host

    def weights(self, scaled: np.ndarray | None = None, factor: float = 1.0) -> np.ndarray:
        """The edge weights with the GPU work marked in `scaled` (per op) taking `factor` x its time."""
        w = self.weight_ns.copy()
        if scaled is not None and factor != 1.0:
            e = self.gpu_edge[scaled & (self.gpu_edge >= 0)]
            w[e] = np.rint(w[e] * factor).astype(np.int64)
        return w

    def replay(self, weight_ns: np.ndarray | None = None) -> np.ndarray:
        """Every time point replayed with the given edge weights (default: as measured)."""
        w = self.weight_ns if weight_ns is None else weight_ns
        return _replay(self.order, self.ptr, self.src, w, self.ext_ns, self.delay_ns)

    def shift_at(self, at_ns: np.ndarray, replayed: np.ndarray) -> np.ndarray:
        """How far the replay moved each time `at_ns` (own clock): the shift of the latest anchor at or
        before it (of those tied, the largest: the least gain), 0 before the first."""
        a = self.anchors
        shift = replayed[a] - self.measured_ns[a]
        by = np.lexsort((shift, self.measured_ns[a]))
        meas, shift = self.measured_ns[a][by], shift[by]
        j = np.searchsorted(meas, np.asarray(at_ns, dtype=np.int64), side="right") - 1
        return np.where(j >= 0, shift[np.maximum(j, 0)], 0)


def build(ev: dict, rank: int, step: int, span_start_ns: int, span_end_ns: int) -> DeviceGraph:
    """The graph of one rank-step from its _dg_events rows (arrays: is_host, name, op_name, tid,
    device, stream, ts_ns, dur_ns, correlation, training)."""
    ts = np.asarray(ev["ts_ns"], dtype=np.int64)
    dur = np.maximum(np.asarray(ev["dur_ns"], dtype=np.int64), 0)
    end = ts + dur
    n = len(ts)
    host = np.asarray(ev["is_host"], dtype=bool)
    names = np.asarray(ev["name"], dtype=object)
    corr = _filled(ev["correlation"], -1)
    start_pt, end_pt, span_pt = 2 * np.arange(n), 2 * np.arange(n) + 1, 2 * n
    measured = np.empty(2 * n + 1, dtype=np.int64)
    measured[0:2 * n:2], measured[1:2 * n:2], measured[span_pt] = ts, end, span_end_ns
    sync = host & np.array([bool(_SYNC.match(x)) if x else False for x in names.tolist()], dtype=bool)
    sync_copy = host & np.array([bool(_SYNC_COPY.match(x)) if x else False for x in names.tolist()], dtype=bool)
    src, dst, w, kind = [], [], [], []

    def add(s, d, wt, k):
        src.append(np.asarray(s, dtype=np.int64))
        dst.append(np.asarray(d, dtype=np.int64))
        w.append(np.broadcast_to(np.asarray(wt, dtype=np.int64), np.shape(s)))
        kind.append(np.full(np.shape(s), k, dtype=np.int8))

    # thread order and call durations (a sync's end is its waits', not its own duration)
    h = np.flatnonzero(host)
    tid = np.unique(np.asarray(ev["tid"], dtype=object).astype(str), return_inverse=True)[1].astype(np.int64)
    hs = h[np.lexsort((end[h], ts[h], tid[h]))]
    same_thread = tid[hs[1:]] == tid[hs[:-1]]
    add(end_pt[hs[:-1][same_thread]], start_pt[hs[1:][same_thread]], 0, _THREAD)
    add(start_pt[h], end_pt[h], np.where(sync[h] | sync_copy[h], 0, dur[h]), _CALL)
    # GPU work: its duration (the scaled edge), its launch, its stream order
    g = np.flatnonzero(~host)
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
    same = (device[gs[1:]] == device[gs[:-1]]) & (stream[gs[1:]] == stream[gs[:-1]])
    add(end_pt[gs[:-1][same]], start_pt[gs[1:][same]], 0, _STREAM)
    # host syncs: device-wide, the last work of each stream launched before the call started
    launched_ns = np.where(launch >= 0, ts[np.maximum(launch, 0)], ts)
    first = np.r_[True, ~same] if len(gs) else np.zeros(0, dtype=bool)
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
    # the span's end: after each training thread's last call; after each stream's last work when
    # the span ends with the device (timeline_spans: the last step)
    training = np.asarray(ev["training"], dtype=bool) & host
    drivers = training if training.any() else host
    last_call = hs[np.r_[~same_thread, True]] if len(hs) else hs
    last_call = last_call[drivers[last_call]]
    add(end_pt[last_call], np.full(len(last_call), span_pt), 0, _END)
    if len(g) and span_end_ns == end[g].max():
        last_work = gs[np.r_[~same, True]]
        add(end_pt[last_work], np.full(len(last_work), span_pt), 0, _END)

    src, dst, w, kind = (np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in (src, dst, w, kind))
    held = measured[src] + w <= measured[dst]
    dropped = {EDGE_KINDS[k]: int(c) for k, c in zip(*np.unique(kind[~held], return_counts=True))}
    src, dst, w, kind = src[held], dst[held], w[held], kind[held]
    by = np.lexsort((src, dst))
    src, dst, w, kind = src[by], dst[by], w[by], kind[by]
    ptr = np.zeros(2 * n + 2, dtype=np.int64)
    np.add.at(ptr, dst + 1, 1)
    ptr = np.cumsum(ptr)
    ext = np.where(measured >= span_start_ns, span_start_ns, measured)
    bound = ext.copy()
    np.maximum.at(bound, dst, measured[src] + w)
    gpu_edge = np.full(n, -1, dtype=np.int64)
    is_gpu = kind == _GPU
    gpu_edge[dst[is_gpu] // 2] = np.flatnonzero(is_gpu)
    order = _topological(2 * n + 1, ptr, src)
    anchors = np.r_[start_pt[g], end_pt[g], start_pt[h[training[h]]], end_pt[h[training[h]]], span_pt]
    op_names = np.asarray(ev["op_name"], dtype=object)
    return DeviceGraph(rank, step, names, op_names, host, measured, ext, measured - bound, ptr, src, w, gpu_edge,
                       order, anchors.astype(np.int64), dropped)


def _filled(column, value) -> np.ndarray:
    """A fetched BIGINT column as int64, `value` where NULL."""
    return np.ma.filled(np.ma.asarray(column).astype(np.int64), value) if np.ma.isMaskedArray(column) \
        else np.asarray(column, dtype=np.int64)


def prepare(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Load the run's launch-level events (_dg_events); False when the run has no kernels."""
    has = con.execute("SELECT count(*) FROM (SELECT 1 FROM events WHERE run_id = ? AND kind = 'kernel' LIMIT 1)",
                      [run_id]).fetchone()[0]
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    if not has or "timeline_threads" not in tables:
        return False
    run_sql_file(con, "bprof.whatif", "device_graph.sql", {"run_id": run_id})
    return True


_COLUMNS = "rank, is_host, name, op_name, tid, device, stream, ts_ns, dur_ns, correlation, training"
_cache: dict = {}


def step_graphs(con: duckdb.DuckDBPyConnection, run_id: int, step: int, spans: dict[int, tuple[int, int]]) -> dict[int, DeviceGraph]:
    """The graphs of one step (prepare() first): rank -> graph, for the ranks of `spans` (rank ->
    (start, end) on its own clock) that ran GPU work in the step. The last step asked is cached:
    several scale parts of one whatif replay the same graphs."""
    key = (id(con), run_id, step, tuple(sorted(spans.items())))
    if key in _cache:
        return _cache[key]
    rows = con.execute(f"SELECT {_COLUMNS} FROM _dg_events WHERE step = ? AND rank IN (SELECT unnest(?)) "
                       "ORDER BY rank, ts_ns", [step, sorted(spans)]).fetchnumpy()
    rank = np.asarray(rows["rank"])
    out = {}
    cuts = np.flatnonzero(np.r_[True, rank[1:] != rank[:-1], True]) if len(rank) else np.zeros(1, dtype=np.int64)
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        r = int(rank[lo])
        ev = {k: _objects(v[lo:hi]) if k in ("name", "op_name", "tid") else v[lo:hi] for k, v in rows.items()}
        if np.asarray(ev["is_host"], dtype=bool).all():
            continue
        out[r] = build(ev, r, step, *spans[r])
    _cache.clear()
    _cache[key] = out
    return out


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
