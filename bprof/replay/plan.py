"""What `bprof replay` reruns: op signatures, loops of small matmuls and collectives, chosen from the store.

Torch-free: it reads events, collectives and findings (and collperf_instances when the run was
analysed) and returns plain items; bprof.replay.ops and bprof.replay.comm rebuild and run them.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

import duckdb

from bprof.errors import UsageError
from bprof.replay.chains import ChainItem, chain_items
from bprof.store import runs as store_runs

# a Python loop of small matmuls: at least this many same-shape calls in a row on one thread
MIN_LOOP_CALLS = 8
# a storm of small collectives: at least this many calls of one op and group per step on a rank
MIN_STORM_CALLS = 8
MATMUL_OPS = ("aten::mm", "aten::matmul", "aten::bmm", "aten::addmm", "aten::linear")


@dataclass(frozen=True)
class OpItem:
    """One op signature (name, shapes, dtypes, strides, concrete inputs) as traced on one rank."""

    kind: str                     # op, or op_loop (loop_len same-signature calls in a row)
    name: str
    rank: int
    dims: list
    types: list
    strides: list
    concrete: list
    traced_ns: list[int]          # per call (op) or per loop (op_loop): what replay is compared with
    calls_per_step: float         # calls (op) or loops (op_loop) per step, median over steps
    traced_on: str                # cpu (op duration) or cuda (device time of the kernels it launched)
    loop_len: int = 1
    finding_id: int | None = None
    finding_title: str | None = None
    et_node: tuple | None = None  # one call's execution trace node (name, op_schema, inputs, outputs), when recorded

    @property
    def label(self) -> str:
        shapes = ", ".join("x".join(map(str, d)) if isinstance(d, list) and d and not isinstance(d[0], list) else
                           ("[]" if d == [] else json.dumps(d)) for d in self.dims if d != [])
        prefix = f"{self.loop_len} x " if self.kind == "op_loop" else ""
        return f"{prefix}{self.name}({shapes}) {'/'.join(t for t in self.types if t)}"

    @property
    def key(self) -> str:
        return json.dumps([self.kind, self.name, self.dims, self.types, self.strides, self.concrete, self.loop_len])


# Collective fix variants, each the same bytes per step in messages of another size:
# bucket: a storm's calls fused into one (one DDP bucket); msg4x: every 4 consecutive calls of a
# storm fused (a bucket_cap_mb 4x larger); split4: each call cut into 4 (messages a quarter the size).
COLLECTIVE_VARIANTS = ("bucket", "msg4x", "split4")


def resized_calls(variant: str, kind: str, elems: list[int]) -> list[int] | None:
    """The elements of each call under a message-size variant; None where it does not apply (bucket
    and msg4x need a storm of calls; split4 a message of at least 4 elements)."""
    if variant == "bucket":
        return [sum(elems)] if kind == "collective_storm" else None
    if variant == "msg4x":
        return [sum(elems[i:i + 4]) for i in range(0, len(elems), 4)] if kind == "collective_storm" else None
    if variant == "split4":
        if min(elems) < 4:
            return None
        return [part for e in elems for part in (e // 4 + (i < e % 4) for i in range(4))]
    raise ValueError(f"not a collective variant: {variant}")


@dataclass(frozen=True)
class CollItem:
    """One collective signature (op, dtype, elements, group) on one rank, or a storm of them (calls)."""

    kind: str                     # collective, or collective_storm (all the calls of one step)
    op: str
    dtype: str | None
    elems: list[int]              # elements of each call (one for a collective)
    group_size: int
    pg_desc: str | None
    rank: int
    traced_ns: list[int]          # per call (collective) or per step (storm)
    traced_basis: str             # transfer (collperf: after the last peer arrived) or call (incl. waiting)
    calls_per_step: float
    finding_id: int | None = None
    finding_title: str | None = None
    bytes_per_elem: int = 4

    @property
    def label(self) -> str:
        size = f"{len(self.elems)} calls, {sum(self.elems):,} elems" if self.kind == "collective_storm" else f"{self.elems[0]:,} elems"
        return f"{self.op} {self.dtype or '?'} {size} over {self.group_size} ranks ({self.pg_desc or 'group'})"

    @property
    def key(self) -> str:
        return json.dumps([self.kind, self.op, self.dtype, self.elems, self.group_size, self.pg_desc])


@dataclass
class Plan:
    run_id: int
    run_name: str
    intra_op_threads: int | None
    ops: list[OpItem] = field(default_factory=list)
    chains: list[ChainItem] = field(default_factory=list)   # from execution traces, when the run has them
    collectives: list[CollItem] = field(default_factory=list)


def resolve_run(con: duckdb.DuckDBPyConnection, run: str | None) -> tuple[int, str]:
    """(run_id, name) of RUN (an id or a name), or of the latest run."""
    run_id = store_runs.resolve_run(con, run)
    return run_id, con.execute("SELECT name FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]


def make_plan(con: duckdb.DuckDBPyConnection, run: str | None, *, top: int = 5, op: str | None = None,
              collectives: bool = True, ops: bool = True) -> Plan:
    """The items to replay: the top `top` op signatures (those a finding names first, then by traced
    time; or those of op `op`), every loop of small matmuls, the top `top` op chains of the execution
    traces (those holding `op`), and the top collectives and storms."""
    run_id, name = resolve_run(con, run)
    plan = Plan(run_id, name, _intra_op_threads(con, run_id))
    if ops:
        plan.ops = _op_items(con, run_id, top, op)
        if op is not None and not plan.ops:
            known = con.execute("SELECT count(*) FROM events WHERE run_id = ? AND kind = 'cpu_op' AND name = ?",
                                [run_id, op]).fetchone()[0]
            why = "it has no recorded shapes (record with shapes)" if known else "no such op in the run"
            raise UsageError(f"op {op!r} not found in run {name!r}: {why}")
        plan.chains = [c for c in chain_items(con, run_id, top, _traced_on(con, run_id)) if op is None or op in c.names]
    if collectives and op is None:
        plan.collectives = _coll_items(con, run_id, top)
    return plan


def _intra_op_threads(con, run_id: int) -> int | None:
    [metadata] = con.execute("SELECT metadata FROM runs WHERE run_id = ?", [run_id]).fetchone()
    threads = (json.loads(metadata or "{}").get("environment") or {}).get("intra_op_threads")
    return int(threads) if threads else None


def _traced_on(con, run_id: int) -> str:
    has_kernels = con.execute("SELECT count(*) FROM events WHERE run_id = ? AND kind = 'kernel' LIMIT 1", [run_id]).fetchone()[0]
    return "cuda" if has_kernels else "cpu"


# Top-level aten ops (not nested in another aten op on their thread) with recorded shapes: what
# Python or autograd called. Algorithm: a sweep per thread over starts (+1) and ends (-1), ends first
# at equal instants and longer ops first among equal starts, gives each op its aten nesting depth;
# depth 1 is top level. On GPU traces an op's time is the device time of the kernels launched
# (runtime calls on its thread inside it, matched to kernels by correlation id).
_TOP_OPS_SQL = """
WITH ops AS (
    SELECT row_number() OVER (ORDER BY rank, tid, ts_ns, dur_ns DESC) AS id, rank, tid, step, ts_ns, dur_ns, name,
           CAST(args -> '$."Input Dims"' AS VARCHAR) AS dims, CAST(args -> '$."Input type"' AS VARCHAR) AS types,
           CAST(args -> '$."Input Strides"' AS VARCHAR) AS strides, CAST(args -> '$."Concrete Inputs"' AS VARCHAR) AS concrete,
           CAST(args ->> '$."Record function id"' AS BIGINT) AS rf_id
    FROM events WHERE run_id = $run_id AND kind = 'cpu_op' AND name LIKE 'aten::%' AND step IS NOT NULL AND dur_ns > 0),
marks AS (
    SELECT id, ts_ns AS at, 1 AS delta, 1 AS ord, -dur_ns AS len FROM ops
    UNION ALL SELECT id, ts_ns + dur_ns, -1, 0, 0 FROM ops),
swept AS (
    SELECT m.id, m.delta, sum(m.delta) OVER (PARTITION BY o.rank, o.tid ORDER BY m.at, m.ord, m.len, m.id ROWS UNBOUNDED PRECEDING) AS d
    FROM marks m JOIN ops o USING (id)),
depth AS (SELECT id, d FROM swept WHERE delta = 1)
SELECT o.* FROM ops o JOIN depth USING (id) WHERE d = 1 AND o.dims IS NOT NULL
"""

# An op's kernels: those of the launches inside it, through the runtime (cudaLaunchKernel) or the
# driver API (cuLaunchKernelEx: Triton, NCCL >= 2.27), each correlation id once (a driver call
# nested in a runtime call shares its id).
_GPU_TIME_SQL = """
WITH launches AS (
    SELECT DISTINCT o.id, o.rank, r.correlation
    FROM _rp_ops o
    JOIN events r ON r.run_id = $run_id AND r.rank = o.rank AND r.tid = o.tid AND r.kind IN ('cuda_runtime', 'cuda_driver')
                  AND r.ts_ns >= o.ts_ns AND r.ts_ns < o.ts_ns + o.dur_ns
)
SELECT l.id, sum(k.dur_ns) AS device_ns
FROM launches l
JOIN events k ON k.run_id = $run_id AND k.rank = l.rank AND k.kind = 'kernel' AND k.correlation = l.correlation
GROUP BY l.id
"""


def _op_items(con, run_id: int, top: int, only: str | None) -> list[OpItem]:
    traced_on = _traced_on(con, run_id)
    con.execute("CREATE OR REPLACE TEMP TABLE _rp_ops AS " + _TOP_OPS_SQL, {"run_id": run_id})
    try:
        if traced_on == "cuda":
            con.execute("CREATE OR REPLACE TEMP TABLE _rp_dev AS " + _GPU_TIME_SQL, {"run_id": run_id})
            con.execute("""CREATE OR REPLACE TEMP TABLE _rp_ops AS
                           SELECT o.* REPLACE (coalesce(d.device_ns, 0) AS dur_ns) FROM _rp_ops o LEFT JOIN _rp_dev d USING (id)""")
        rows = con.execute("""
            SELECT name, dims, types, strides, concrete, min(rank) AS rank, list(dur_ns ORDER BY ts_ns) AS durs,
                   sum(dur_ns) AS total_ns, count(*) AS calls, count(DISTINCT step) AS steps, count(DISTINCT rank) AS ranks,
                   arg_min(rf_id, (rank, ts_ns)) AS rf_id
            FROM _rp_ops WHERE ($only IS NULL OR name = $only) AND dur_ns > 0
            GROUP BY ALL ORDER BY total_ns DESC LIMIT 200""", {"only": only}).fetchall()
        items = []
        for name, dims, types, strides, concrete, rank, durs, _total, calls, steps, ranks, rf_id in rows:
            items.append(OpItem("op", name, rank, json.loads(dims), json.loads(types or "[]"), json.loads(strides or "[]"),
                                json.loads(concrete or "[]"), durs, calls / max(1, steps * ranks), traced_on,
                                et_node=_et_node(con, run_id, rank, rf_id, name)))
        loops = [i for i in _loop_items(con, traced_on) if only is None or i.name == only]
    finally:
        con.execute("DROP TABLE IF EXISTS _rp_ops")
        con.execute("DROP TABLE IF EXISTS _rp_dev")
    items = [_linked(con, run_id, i) for i in items]
    # findings first (what an analyzer already called slow), then traced time
    items.sort(key=lambda i: (i.finding_id is None, -sum(i.traced_ns)))
    return items[:top] + [_linked(con, run_id, i) for i in loops]


def _et_node(con, run_id: int, rank: int, rf_id: int | None, name: str) -> tuple | None:
    """The execution trace node of one call (rank, record function id), if the run has execution traces."""
    if rf_id is None:
        return None
    row = con.execute("""SELECT name, op_schema, CAST(inputs AS VARCHAR), CAST(outputs AS VARCHAR) FROM exec_nodes
                         WHERE run_id = ? AND rank = ? AND rf_id = ? AND name = ? LIMIT 1""", [run_id, rank, rf_id, name]).fetchone()
    return tuple(row) if row else None


def _loop_items(con, traced_on: str) -> list[OpItem]:
    """Runs of at least MIN_LOOP_CALLS same-signature top-level matmul calls in a row on one thread."""
    rows = con.execute(f"""
        WITH seq AS (
            SELECT *, row_number() OVER w - row_number() OVER (PARTITION BY rank, tid, step, name, dims, types, strides ORDER BY ts_ns) AS grp
            FROM _rp_ops WINDOW w AS (PARTITION BY rank, tid, step ORDER BY ts_ns)),
        runs AS (
            SELECT rank, step, name, dims, types, strides, any_value(concrete) AS concrete, count(*) AS n, sum(dur_ns) AS dur_ns
            FROM seq WHERE name IN (SELECT unnest($mm)) GROUP BY rank, tid, step, name, dims, types, strides, grp
            HAVING count(*) >= {MIN_LOOP_CALLS})
        SELECT name, dims, types, strides, any_value(concrete), n, min(rank), list(dur_ns ORDER BY step), count(*), count(DISTINCT step) * count(DISTINCT rank)
        FROM runs GROUP BY name, dims, types, strides, n ORDER BY sum(dur_ns) DESC""", {"mm": list(MATMUL_OPS)}).fetchall()
    return [OpItem("op_loop", name, rank, json.loads(dims), json.loads(types or "[]"), json.loads(strides or "[]"),
                   json.loads(concrete or "[]"), durs, count / max(1, steps), traced_on, loop_len=n)
            for name, dims, types, strides, concrete, n, rank, durs, count, steps in rows]


def _linked(con, run_id: int, item):
    """The analyze finding an item verifies: one whose evidence names it, else, for a matmul, the
    kernels analyzer's precision finding, for a collective the exposed-communication or straggler one."""
    name = item.name if isinstance(item, OpItem) else item.op
    rows = con.execute("""
        SELECT finding_id, title FROM findings WHERE run_id = ? AND analyzer <> 'replay' AND severity <> 'not_measurable'
          AND (CAST(evidence AS VARCHAR) LIKE '%' || ? || '%'
               OR (? AND analyzer = 'kernels' AND title LIKE 'fp32 matmuls%')
               OR (? AND (analyzer = 'stragglers' OR title LIKE 'Exposed%communication%')))
        ORDER BY (CAST(evidence AS VARCHAR) LIKE '%' || ? || '%') DESC, lost_ns DESC NULLS LAST LIMIT 1""",
                       [run_id, json.dumps(name), isinstance(item, OpItem) and name in MATMUL_OPS,
                        isinstance(item, CollItem), json.dumps(name)]).fetchall()
    if not rows:
        return item
    from dataclasses import replace
    return replace(item, finding_id=rows[0][0], finding_title=rows[0][1])


_ELEM_BYTES = {"float": 4, "float32": 4, "double": 8, "float64": 8, "bfloat16": 2, "c10::bfloat16": 2, "half": 2,
               "float16": 2, "c10::half": 2, "int": 4, "int32": 4, "long": 8, "long int": 8, "int64": 8}


def _coll_items(con, run_id: int, top: int) -> list[CollItem]:
    has_collperf = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'collperf_instances'").fetchone()[0]
    transfer = ("(SELECT any_value(i.transfer_ns) FROM collperf_instances i WHERE i.run_id = c.run_id AND i.pg_name = c.pg_name "
                "AND i.seq = c.seq AND i.op = c.op AND i.timing = 'device')" if has_collperf else "NULL")
    rows = con.execute(f"""
        SELECT rank, step, op, dtype, in_elems, group_size, pg_desc, coalesce(device_dur_ns, cpu_dur_ns) AS call_ns,
               {transfer} AS transfer_ns
        FROM collectives c WHERE run_id = ? AND NOT is_p2p AND step IS NOT NULL AND in_elems IS NOT NULL
        ORDER BY rank, step, call_index""", [run_id]).fetchall()
    by_sig: dict = {}
    storms: dict = {}
    for rank, step, op, dtype, elems, size, desc, call_ns, transfer_ns in rows:
        basis, ns = ("transfer", transfer_ns) if transfer_ns is not None and transfer_ns > 0 else ("call", call_ns)
        sig = (op, dtype, elems, size, desc)
        entry = by_sig.setdefault(sig, {"ranks": set(), "rank": rank, "ns": [], "basis": basis, "steps": set()})
        entry["ranks"].add(rank)
        entry["steps"].add(step)
        if ns is not None and rank == entry["rank"]:
            entry["ns"].append(ns)
        storms.setdefault((op, dtype, size, desc, rank), {}).setdefault(step, []).append((elems, ns))
    items = []
    for (op, dtype, elems, size, desc), e in by_sig.items():
        if e["ns"]:
            items.append(CollItem("collective", op, dtype, [elems], size or 1, desc, e["rank"], e["ns"], e["basis"],
                                  len(e["ns"]) / len(e["steps"]), bytes_per_elem=_ELEM_BYTES.get((dtype or "").lower(), 4)))
    items.sort(key=lambda i: -sum(i.traced_ns))
    items = [_linked(con, run_id, i) for i in items[:top]]
    for (op, dtype, size, desc, rank), steps in storms.items():
        calls = [len(v) for v in steps.values()]
        if op != "all_reduce" or min(calls) < MIN_STORM_CALLS or rank != min(r for (o, d, s, g, r) in storms if (o, d, s, g) == (op, dtype, size, desc)):
            continue
        first = steps[min(steps)]
        per_step = [sum(ns for _, ns in v if ns is not None) for v in steps.values()]
        items.append(_linked(con, run_id, CollItem(
            "collective_storm", op, dtype, [e for e, _ in first], size or 1, desc, rank, per_step, "call", 1.0,
            bytes_per_elem=_ELEM_BYTES.get((dtype or "").lower(), 4))))
    return items


def spread_of(values: list[float]) -> float | None:
    """(max - min) / median, as bprof calibrate reports the spread of its repeats; None below two values."""
    if len(values) < 2:
        return None
    median = statistics.median(values)
    return (max(values) - min(values)) / median if median else None
