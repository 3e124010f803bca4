"""Short op sequences to replay as a whole (and to verify torch.compile on), read from execution traces.

Torch-free. Kineto records each op's shapes but not which op's output fed which input; the
execution trace (exec_nodes) does, with tensor ids. A chain is a run of consecutive top-level ops on
one thread of one step (top level: not inside another op; what Python or autograd called), each
reading a tensor an earlier op of the run wrote or read, with at least one such output-to-input
edge; at most MAX_CHAIN_OPS ops (longer runs are cut). Ops that read no tensor (factories), matmuls,
convolutions, attention and collectives end a chain. Chains of the same signature (the ops'
overloads, shapes, dtypes, strides, argument values and wiring) are one item, traced once per
occurrence as the sum of their ops' times: op durations on CPU traces, the device time of the
kernels each op launched (External id) on GPU traces.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb

MAX_CHAIN_OPS = 16
MIN_CHAIN_OPS = 2
# ops never part of a chain: collectives and p2p (they need a process group), ops whose work is
# elsewhere (record_param_comms, profiler markers), and the matmuls, convolutions and attention that
# replay takes one by one as op items: a chain is the glue between them, what fusion speeds up
_EXCLUDED_PREFIXES = ("c10d::", "record_param_comms", "profiler::", "autograd::")
_EXCLUDED_OPS = frozenset({
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::conv1d",
    "aten::conv2d", "aten::conv3d", "aten::convolution", "aten::scaled_dot_product_attention", "aten::embedding"})

_TOP_NODES_SQL = """
WITH ops AS (
    -- the Kineto side of each execution trace op node: same rank, record function id and name
    SELECT rank, name, CAST(args ->> '$."Record function id"' AS BIGINT) AS rf_id, step, ts_ns, dur_ns, external_id
    FROM events WHERE run_id = $run_id AND kind = 'cpu_op'),
tops AS (
    -- top level: the node's parent is no op (a record_function range, the thread's root), or the
    -- parent link is wrong: the parent op's traced interval does not hold the node's start. Torch's
    -- observer can leave an op of one thread open as the parent of what follows (seen on a 2-rank DDP
    -- run: a backward aten::as_strided adopted the next step's forward ops).
    SELECT n.rank, n.tid, n.node_id, n.name, n.rf_id, n.op_schema, CAST(n.inputs AS VARCHAR) AS inputs,
           CAST(n.outputs AS VARCHAR) AS outputs
    FROM exec_nodes n
    LEFT JOIN exec_nodes p ON p.run_id = n.run_id AND p.rank = n.rank AND p.node_id = n.parent_id
    LEFT JOIN ops po ON po.rank = p.rank AND po.rf_id = p.rf_id AND po.name = p.name
    LEFT JOIN ops o ON o.rank = n.rank AND o.rf_id = n.rf_id AND o.name = n.name
    WHERE n.run_id = $run_id AND n.op_schema IS NOT NULL
      AND (p.op_schema IS NULL OR NOT (o.ts_ns BETWEEN po.ts_ns AND po.ts_ns + po.dur_ns))),
ev AS (
    SELECT * FROM ops WHERE step IS NOT NULL),
dev AS (
    SELECT rank, external_id, sum(dur_ns) AS device_ns FROM events
    WHERE run_id = $run_id AND kind = 'kernel' AND external_id IS NOT NULL GROUP BY ALL)
SELECT t.rank, t.tid, t.node_id, t.name, t.op_schema, t.inputs, t.outputs, ev.step,
       CASE WHEN $device THEN coalesce(dev.device_ns, 0) ELSE ev.dur_ns END AS dur_ns
FROM tops t
JOIN ev ON ev.rank = t.rank AND ev.rf_id = t.rf_id AND ev.name = t.name
LEFT JOIN dev ON $device AND dev.rank = t.rank AND dev.external_id = ev.external_id
ORDER BY t.rank, t.tid, t.node_id
"""


@dataclass(frozen=True)
class ChainItem:
    """One chain signature: its first occurrence's nodes (as the execution trace wrote them) and the
    traced time of every occurrence."""

    kind: str                     # op_chain
    rank: int
    nodes: tuple                  # ((name, op_schema, inputs JSON, outputs JSON), ...) of the first occurrence
    traced_ns: list[int]          # per occurrence: the sum of its ops' times
    calls_per_step: float         # occurrences per step, median rank
    traced_on: str
    finding_id: int | None = None
    finding_title: str | None = None

    @property
    def names(self) -> list[str]:
        return [n[0] for n in self.nodes]

    @property
    def label(self) -> str:
        first = json.loads(self.nodes[0][2])
        shape = next((s for s, t in zip(first.get("shapes", []), first.get("types", []))
                      if str(t).startswith("Tensor(") and isinstance(s, list)), None)
        dtype = next((t[7:-1] for t in first.get("types", []) if str(t).startswith("Tensor(")), "?")
        size = "x".join(map(str, shape)) if shape else "scalar"
        return f"chain of {len(self.nodes)}: {' > '.join(n.split('::')[-1] for n in self.names)} ({size} {dtype})"

    @property
    def key(self) -> str:
        return json.dumps(["op_chain", _signature(self.nodes)])


def chain_items(con: duckdb.DuckDBPyConnection, run_id: int, top: int, traced_on: str) -> list[ChainItem]:
    """The `top` chain signatures with the most traced time per step; [] without execution traces."""
    has = con.execute("SELECT count(*) FROM exec_nodes WHERE run_id = ? LIMIT 1", [run_id]).fetchone()[0]
    if not has:
        return []
    rows = con.execute(_TOP_NODES_SQL, {"run_id": run_id, "device": traced_on == "cuda"}).fetchall()
    groups: dict[str, dict] = {}
    for rank, step, chain in _chains(rows):
        nodes = tuple((name, schema, inputs, outputs) for name, schema, inputs, outputs, _ in chain)
        sig = json.dumps(_signature(nodes))
        g = groups.setdefault(sig, {"nodes": nodes, "rank": rank, "ns": [], "count": {}})
        g["count"][(rank, step)] = g["count"].get((rank, step), 0) + 1
        if rank == g["rank"]:
            g["ns"].append(sum(d for *_, d in chain))
    steps = {rs for g in groups.values() for rs in g["count"]}
    items = []
    for g in groups.values():
        per_rank_step = sorted(g["count"].get(rs, 0) for rs in steps)
        items.append(ChainItem("op_chain", g["rank"], g["nodes"], g["ns"], float(per_rank_step[len(per_rank_step) // 2]),
                               traced_on))
    items.sort(key=lambda i: -sum(i.traced_ns) / max(1, len(i.traced_ns)) * i.calls_per_step)
    return items[:top]


def _chains(rows):
    """(rank, step, [(name, schema, inputs, outputs, dur_ns), ...]) for each chain in the ordered top-level ops."""
    chain, seen, written, edges, key = [], set(), set(), 0, None
    for rank, tid, _node, name, schema, inputs, outputs, step, dur in rows:
        ins, outs = json.loads(inputs or "{}"), json.loads(outputs or "{}")
        reads, writes = tensor_ids(ins), tensor_ids(outs)
        joins = (rank, tid, step) == key and bool(reads & (seen | written)) and len(chain) < MAX_CHAIN_OPS
        usable = bool(reads) and bool(writes) and name not in _EXCLUDED_OPS and not name.startswith(_EXCLUDED_PREFIXES)
        if joins and usable:
            edges += bool(reads & written)
            chain.append((name, schema, inputs, outputs, dur))
            seen |= reads
            written |= writes
            continue
        if len(chain) >= MIN_CHAIN_OPS and edges:
            yield key[0], key[2], chain
        chain, seen, written, edges, key = [], set(), set(), 0, (rank, tid, step)
        if usable:
            chain, seen, written = [(name, schema, inputs, outputs, dur)], reads, writes
    if len(chain) >= MIN_CHAIN_OPS and edges:
        yield key[0], key[2], chain


def tensor_ids(args: dict) -> set[int]:
    """The tensor ids among an execution trace node's inputs or outputs (lists of tensors included)."""
    out: set[int] = set()
    for value, kind in zip(args.get("values", []), args.get("types", [])):
        _collect(value, str(kind), out)
    return out


def _collect(value, kind: str, out: set[int]) -> None:
    if kind.startswith("Tensor(") and not kind.startswith("Tensor(nullptr") and isinstance(value, list) and value \
            and isinstance(value[0], int):
        out.add(value[0])
    elif kind.startswith("GenericList[") and isinstance(value, list):
        inner = list_types(kind)
        for i, v in enumerate(value):
            _collect(v, inner[i] if i < len(inner) else (inner[-1] if inner else ""), out)


def list_types(kind: str) -> list[str]:
    """GenericList[Tensor(float),Tensor(float)] -> ['Tensor(float)', 'Tensor(float)']."""
    body, parts, depth, cur = kind[len("GenericList["):-1], [], 0, ""
    for ch in body:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        cur += ch
    if cur:
        parts.append(cur)
    return parts


def wiring(nodes) -> list[list]:
    """Per node, per input: ["ext", k] for the k-th distinct tensor from outside the chain, ["op", j, m]
    for output m of node j, or None for a non-tensor argument (lists of tensors: a list of these)."""
    produced: dict[int, tuple[int, int]] = {}
    external: dict[int, int] = {}
    out = []
    for j, (_name, _schema, inputs, outputs) in enumerate(nodes):
        ins = json.loads(inputs or "{}")
        out.append([_source(v, str(t), produced, external) for v, t in zip(ins.get("values", []), ins.get("types", []))])
        outs = json.loads(outputs or "{}")
        for m, (v, t) in enumerate(zip(outs.get("values", []), outs.get("types", []))):
            if str(t).startswith("Tensor(") and isinstance(v, list) and v:
                produced[v[0]] = (j, m)
    return out


def _source(value, kind: str, produced, external):
    if kind.startswith("Tensor(nullptr"):  # an undefined optional tensor: None, not an input
        return None
    if kind.startswith("Tensor(") and isinstance(value, list) and value and isinstance(value[0], int):
        if value[0] in produced:
            return ["op", *produced[value[0]]]
        return ["ext", external.setdefault(value[0], len(external))]
    if kind.startswith("GenericList[") and isinstance(value, list):
        inner = list_types(kind)
        sources = [_source(v, inner[i] if i < len(inner) else (inner[-1] if inner else ""), produced, external)
                   for i, v in enumerate(value)]
        return sources if any(s is not None for s in sources) else None  # a list of ints is a value
    return None


def _signature(nodes) -> list:
    """What makes two chains the same replay: overloads, shapes, types, strides, non-tensor values, wiring."""
    sig = []
    for (name, schema, inputs, _outputs), wires in zip(nodes, wiring(nodes)):
        ins = json.loads(inputs or "{}")
        values = [None if w is not None else v for v, w in zip(ins.get("values", []), wires)]
        sig.append([schema or name, ins.get("shapes"), ins.get("types"), ins.get("strides"), values, wires])
    return sig
