"""How much of each step's exposed communication was waiting for the last peer to arrive?

Splits breakdown_steps.exposed_comm_ns into exposed_wait_ns and exposed_transfer_ns once
cross-rank analysis has matched collectives and aligned clocks (collperf_waits: each member's wait
as an interval on its own clock). Run by the breakdown analyzer when collperf_waits holds rows.

Algorithm: per rank and step, the union of its wait intervals (concurrent collectives can wait at
once), clipped to the step's span, intersected with the exposed_comm segments of its partition
(the temp table _bd_seg of breakdown.sql); the rest of the exposed time is transfer (or
communication the matching could not see: cut or unmatched calls). The interval work is numpy
(overlap.union_overlap_ns), a block of 1,024 ranks at a time, so memory stays bounded at 10,000
ranks (about 3.6 million waits per block there).
"""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa

from bprof.analyzers.overlap import union_overlap_ns

RANKS_PER_BLOCK = 1024  # 4,096 measured slower and 2.4 GiB larger at 10,240 ranks


def split_waits(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Fill exposed_wait_ns and exposed_transfer_ns of every breakdown_steps row of the run."""
    [(lo_rank, hi_rank)] = con.execute("SELECT min(rank), max(rank) FROM breakdown_steps WHERE run_id = ?",
                                       [run_id]).fetchall()
    if lo_rank is None:
        return
    parts = []
    for lo in range(lo_rank, hi_rank + 1, RANKS_PER_BLOCK):
        parts.append(_block(con, run_id, lo, lo + RANKS_PER_BLOCK))
    con.register("_bd_waits", pa.table({k: np.concatenate([p[k] for p in parts]) for k in ("rank", "step", "wait_ns")}))
    try:
        con.execute("""
            UPDATE breakdown_steps b SET exposed_wait_ns = w.wait_ns, exposed_transfer_ns = b.exposed_comm_ns - w.wait_ns
            FROM _bd_waits w WHERE b.run_id = ? AND b.rank = w.rank AND b.step = w.step""", [run_id])
    finally:
        con.unregister("_bd_waits")


def _block(con: duckdb.DuckDBPyConnection, run_id: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Wait per (rank, step) of breakdown_steps for ranks lo <= rank < hi."""
    keys = _np(con.execute("""
        SELECT b.rank, b.step, s.ts_ns FROM breakdown_steps b
        JOIN timeline_spans s ON s.run_id = b.run_id AND s.rank = b.rank AND s.step = b.step
        WHERE b.run_id = ? AND b.rank >= ? AND b.rank < ? ORDER BY b.rank, b.step""", [run_id, lo, hi]))
    waits = _np(con.execute("""
        SELECT w.rank, s.step, greatest(w.ts_ns, s.ts_ns) AS ts_ns, least(w.end_ns, s.ts_ns + s.dur_ns) AS end_ns
        FROM collperf_waits w JOIN timeline_spans s ON s.run_id = w.run_id AND s.rank = w.rank
             AND w.ts_ns < s.ts_ns + s.dur_ns AND w.end_ns > s.ts_ns
        WHERE w.run_id = ? AND w.rank >= ? AND w.rank < ?""", [run_id, lo, hi]))
    segments = _np(con.execute("""
        SELECT rank, step, ts_ns, end_ns FROM _bd_seg WHERE label = 'exposed_comm' AND rank >= ? AND rank < ?""", [lo, hi]))
    code = keys["rank"].astype(np.int64) << 32 | (keys["step"].astype(np.int64) & 0xFFFFFFFF)

    def key_of(rows):
        c = rows["rank"].astype(np.int64) << 32 | (rows["step"].astype(np.int64) & 0xFFFFFFFF)
        i = np.minimum(np.searchsorted(code, c), max(len(code) - 1, 0))
        found = code[i] == c if len(code) else np.zeros(len(c), dtype=bool)
        return i[found], rows["ts_ns"][found], rows["end_ns"][found]

    wait_ns = union_overlap_ns(len(code), keys["ts_ns"], *key_of(waits), *key_of(segments))
    return {"rank": keys["rank"], "step": keys["step"], "wait_ns": wait_ns}


def _np(cursor: duckdb.DuckDBPyConnection) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in cursor.fetchnumpy().items()}
