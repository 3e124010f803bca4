"""Execution traces (PyTorch's ExecutionTraceObserver, Chakra JSON) into exec_nodes.

`bprof record --execution-trace` writes one per rank and window next to the Kineto trace
(traces/iteration_N/rankR.et.json). Kineto records shapes; the execution trace adds what replay
needs to rebuild a sequence of ops: which tensor each op read and wrote (tensor ids), every
argument's value (ints, lists, dtypes) and the op's overload. Its nodes join Kineto events on the
record function id. Loaded inside ingest's transaction: a bad file fails the run, naming the file.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import duckdb
import pyarrow as pa

from bprof.errors import DataError

_COLUMNS = ("run_id", "rank", "node_id", "parent_id", "name", "rf_id", "tid", "op_schema", "inputs", "outputs")


def exec_trace_path(trace: Path, rank: int) -> Path | None:
    """The execution trace beside a rank's Kineto trace (rankR.et.json, or .et.json.gz), if there is one."""
    for name in (f"rank{rank}.et.json", f"rank{rank}.et.json.gz"):
        path = trace.parent / name
        if path.is_file():
            return path
    return None


def load_exec_traces(con: duckdb.DuckDBPyConnection, run_id: int, traces: dict[int, Path]) -> int:
    """Insert the nodes of every rank's execution trace (rank -> its Kineto trace path); returns the
    nodes loaded. DataError names a file that is not a readable execution trace."""
    loaded = 0
    for rank, trace in sorted(traces.items()):
        path = exec_trace_path(trace, rank)
        if path is None:
            continue
        rows = _rows(path, run_id, rank)
        if rows["node_id"]:
            con.register("_et_nodes", pa.table(rows))
            try:
                con.execute(f"INSERT INTO exec_nodes SELECT {', '.join(_COLUMNS)} FROM _et_nodes")
            finally:
                con.unregister("_et_nodes")
            loaded += len(rows["node_id"])
    return loaded


def _rows(path: Path, run_id: int, rank: int) -> dict[str, list]:
    try:
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt") as f:
            doc = json.load(f)
    except (OSError, EOFError, ValueError) as exc:  # truncated gzip, cut JSON, unreadable file
        raise DataError(f"{path}: unreadable execution trace ({str(exc).splitlines()[0][:200]})") from None
    nodes = doc.get("nodes") if isinstance(doc, dict) else None
    if not isinstance(nodes, list):
        raise DataError(f"{path}: not an execution trace (no 'nodes' list)")
    rows: dict[str, list] = {c: [] for c in _COLUMNS}
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or not isinstance(node.get("id"), int) or not isinstance(node.get("name"), str):
            raise DataError(f"{path}: node {i} has no integer id or no name")
        attrs = {a.get("name"): a.get("value") for a in node.get("attrs") or [] if isinstance(a, dict)}
        parent = node.get("ctrl_deps", node.get("parent"))  # 'parent' in schemas before Chakra
        rows["run_id"].append(run_id)
        rows["rank"].append(rank)
        rows["node_id"].append(node["id"])
        rows["parent_id"].append(parent if isinstance(parent, int) else None)
        rows["name"].append(node["name"])
        rows["rf_id"].append(_int(attrs.get("rf_id")))
        rows["tid"].append(_int(attrs.get("tid")))
        rows["op_schema"].append(attrs.get("op_schema") or None)
        rows["inputs"].append(json.dumps(node.get("inputs")) if node.get("inputs") is not None else None)
        rows["outputs"].append(json.dumps(node.get("outputs")) if node.get("outputs") is not None else None)
    return rows


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
