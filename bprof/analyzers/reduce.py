"""`bprof reduce`: one rank's trace -> its compact tables (the reduced format of bprof.store.reduce),
small enough that a 10,000-rank job ships megabytes to cross-rank analysis, not terabytes.

The rank is ingested alone into a scratch store with the ordinary ingest (its `bprof record`
metadata and Flight Recorder entries included), the timeline and breakdown analyzers run over it,
and what cross-rank analysis reads is written as Parquet: the rank's ranks, steps, collectives and
clock_samples rows, its step spans (timeline_spans), its per-step partition (breakdown_steps),
the exposed-communication intervals of that partition (which collperf splits into waiting and
transfer) and its communication per parallel dimension (breakdown_dims). Nothing of it depends on
other ranks but the dimension of a process group, which breakdown infers from the rank's own groups.
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

import bprof
from bprof.analyzers import breakdown, timeline
from bprof.analyzers.base import Options
from bprof.errors import UsageError
from bprof.store.db import open_store
from bprof.store.discover import RunFiles
from bprof.store.ingest import IngestOptions, ingest_run
from bprof.store.kineto_file import trace_path, trace_text
from bprof.store.reduce import FORMAT, FORMAT_VERSION, MANIFEST, SUFFIX, TABLES, file_sha256, is_reduced_dir, now_iso, replaced_dir

# Where each reduced table's rows come from in the scratch store; $run_id is bound. Columns are
# the target store table's, minus run_id (see _columns).
_SOURCES = {
    "ranks": "ranks",
    "steps": "steps",
    "collectives": "collectives",
    "clock_samples": "clock_samples",
    "spans": "timeline_spans",
    "breakdown": "breakdown_steps",
    # per-dimension communication (per rank, step, dim), with the dimensions breakdown gave the
    # rank's own process groups (see breakdown.sql on how that can differ from the run's)
    "dims": "breakdown_dims",
    # breakdown's labelled segments (its temp table _bd_seg, alive on this connection), adjacent
    # exposed_comm ones merged: the sums of their overlaps with any interval set stay the same
    "exposed_comm": """(
        WITH x AS (
            SELECT rank, step, ts_ns, end_ns,
                CASE WHEN lag(end_ns) OVER w = ts_ns THEN 0 ELSE 1 END AS starts
            FROM _bd_seg WHERE label = 'exposed_comm'
            WINDOW w AS (PARTITION BY rank, step ORDER BY ts_ns)
        ), g AS (
            SELECT *, sum(starts) OVER (PARTITION BY rank, step ORDER BY ts_ns ROWS UNBOUNDED PRECEDING) AS part
            FROM x
        )
        SELECT $run_id AS run_id, rank, step, min(ts_ns) AS ts_ns, max(end_ns) - min(ts_ns) AS dur_ns
        FROM g GROUP BY rank, step, part
    )""",
}
# the order rows are written in, so that reducing the same trace twice writes the same files
_ORDER = {"ranks": "rank", "steps": "step", "collectives": "call_index", "clock_samples": "phase, send_ns",
          "spans": "step", "breakdown": "step", "exposed_comm": "step, ts_ns", "dims": "step, dim"}


@dataclass
class ReduceResult:
    trace: Path
    out: Path
    rank: int
    trace_bytes: int  # the trace file as stored (gzip or not)
    trace_json_bytes: int  # its uncompressed JSON
    num_events: int
    rows: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)  # per Parquet file, and the manifest
    reduced_bytes: int = 0  # all of out/
    seconds: float = 0.0

    @property
    def trace_ratio(self) -> float:
        """reduced_bytes / trace_bytes: how much of the file a rank would ship."""
        return self.reduced_bytes / self.trace_bytes if self.trace_bytes else 0.0

    def summary(self) -> dict:
        return {**self.__dict__, "trace": str(self.trace), "out": str(self.out), "trace_ratio": self.trace_ratio}


def reduce_trace(trace: Path, out: Path | None = None, *, rank: int | None = None, work_dir: Path | None = None,
                 memory_limit: str = "600MB", threads: int | None = None) -> ReduceResult:
    """Reduce one rank's trace into `out` (default: rank<R>.reduced beside the trace), replacing an
    earlier reduced output there; the directory appears whole or not at all. `threads` caps
    DuckDB's threads (default: one per core), for a reduce that runs beside training. The trace may
    be an fsspec URL (kineto_file.trace_path), read as a stream; `out` is a local directory."""
    started = time.perf_counter()
    trace = trace_path(trace)
    if not trace.is_file():
        raise UsageError(f"{trace}: no such trace file (bprof reduce takes one rank's trace)")
    if out is not None and Path(out).exists() and not is_reduced_dir(Path(out)):
        raise UsageError(f"{out}: exists and is not a reduced output (*{SUFFIX}); pick another --out")
    with tempfile.TemporaryDirectory(prefix="bprof-reduce-", dir=work_dir) as tmp:
        # a file store, so that DuckDB spills past memory_limit instead of failing on a large trace
        con = open_store(Path(tmp) / "rank.duckdb")
        try:
            if not isinstance(trace, Path):  # files beside a remote trace (Flight Recorder entries) are read by DuckDB
                con.register_filesystem(trace.fs)
            if threads is not None:
                con.execute(f"SET threads = {max(1, int(threads))}")  # an int, checked: SET takes no parameter
            ingested = ingest_run(con, RunFiles(trace.name, (trace,), named=frozenset({trace})),
                                  IngestOptions(rank=rank, workers=1, work_dir=Path(tmp), memory_limit=memory_limit))
            run_id = ingested.run_id
            [(rank,)] = con.execute("SELECT rank FROM ranks WHERE run_id = ?", [run_id]).fetchall()
            con.execute("BEGIN TRANSACTION")
            timeline.analyze(con, run_id, Options())
            breakdown.analyze(con, run_id, Options())
            con.execute("COMMIT")
            out = Path(out) if out is not None else trace.parent / f"rank{rank}{SUFFIX}"
            result = ReduceResult(trace, out, rank, trace.stat().st_size, ingested.uncompressed_bytes, ingested.num_events)
            _write(con, run_id, result, _run_facts(ingested.metadata_by_rank[rank]))
        finally:
            con.close()
    result.seconds = time.perf_counter() - started
    return result


def _write(con: duckdb.DuckDBPyConnection, run_id: int, result: ReduceResult, metadata: dict) -> None:
    """Write every table and the manifest into a temporary sibling of result.out, then swap it in."""
    out = result.out
    with replaced_dir(out) as staging:
        tables = {}
        for name, target in TABLES.items():
            path = staging / f"{name}.parquet"
            # names and columns come from this module's and the store's own constants; COPY takes
            # no bound path, so the path is quoted here, and the run id stays a parameter
            quoted = str(path).replace("'", "''")
            con.execute(f"COPY (SELECT {_columns(con, target)} FROM {_SOURCES[name]} WHERE run_id = $run_id "
                        f"ORDER BY {_ORDER[name]}) TO '{quoted}' (FORMAT parquet, COMPRESSION zstd)",
                        {"run_id": run_id})
            rows = con.execute("SELECT count(*) FROM read_parquet(?)", [str(path)]).fetchone()[0]
            tables[name] = {"rows": rows, "bytes": path.stat().st_size, "sha256": file_sha256(path)}
        manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "rank": result.rank,
            "bprof_version": bprof.__version__, "reduced_at": now_iso(),
            "trace": {"path": trace_text(result.trace), "bytes": result.trace_bytes,
                      "json_bytes": result.trace_json_bytes, "num_events": result.num_events,
                      "window": _window(result.trace)},
            "metadata": metadata,
            "tables": tables,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
    result.rows = {n: t["rows"] for n, t in tables.items()}
    result.bytes = {f"{n}.parquet": t["bytes"] for n, t in tables.items()} | {MANIFEST: (out / MANIFEST).stat().st_size}
    result.reduced_bytes = sum(result.bytes.values())


def _columns(con: duckdb.DuckDBPyConnection, table: str) -> str:
    """The store table's columns minus run_id, JSON ones as text (Parquet has no JSON type)."""
    rows = con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? AND NOT internal "
                       "AND column_name <> 'run_id' ORDER BY column_index", [table]).fetchall()
    return ", ".join(f"CAST({c} AS VARCHAR) AS {c}" if t == "JSON" else c for c, t in rows)


def _run_facts(meta: dict) -> dict:
    """The part of a rank's metadata that ingest turns into the runs row (see ingest._finish_run);
    bprof record's clock samples travel as the clock_samples table instead."""
    facts = {k: meta[k] for k in ("distributedInfo", "bprof", "bprof_model") if meta.get(k) is not None}
    if isinstance(meta.get("bprof_record"), dict):
        facts["bprof_record"] = {k: v for k, v in meta["bprof_record"].items() if k != "clock_sync"}
    return facts


def _window(trace: Path) -> str | None:
    """bprof record's window folder (iteration_N) of the trace, which all ranks of a run share."""
    parent = trace.resolve().parent if isinstance(trace, Path) else trace.parent
    return parent.name if parent.name.startswith("iteration_") and parent.parent.name == "traces" else None
