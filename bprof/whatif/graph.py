"""Each analysed step as the what-if replay sees it: per rank, the chain of work segments between its
collectives (StepGraph), and what each work segment is made of, measured: host gaps (device idle,
and on CPU traces data-loading ranges) and, on demand, the time of a kernel class or op name.

Reads what bprof analyze wrote (graph.sql: match_*, timeline_spans; breakdown_idle_gaps; events for
the parts); writes only temp tables. A rank without events (ingested from `bprof reduce` output)
has segments without parts: host gaps and classes are 0 there, and the assumptions say so.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa

from bprof.store.sqlfile import run_sql_file
from bprof.whatif.engine import StepGraph, exit_offsets, work_segments
from bprof.whatif.peers import SYMMETRIC_OPS


@dataclasses.dataclass
class StepModel:
    """One step: its graph and the measured parts. Per member row (StepGraph order): `work` (time
    from the previous exit, or the span start, to the arrival), `exit_after` (exit after the
    instance's last arrival: the transfer it saw), `host_ns` (host gaps inside that work). Per span
    rank: `tail` (time after the last exit to the span end) and `tail_host_ns`. Per dense instance:
    its op, bytes, group size (the collective cost model's inputs) and parallel dimension."""

    step: int
    g: StepGraph
    role: np.ndarray
    stage: np.ndarray  # per span rank: pipeline stage (-1 without one)
    offset_ns: np.ndarray  # per span rank: aligned minus own clock
    work: np.ndarray
    tail: np.ndarray
    exit_after: np.ndarray
    host_ns: np.ndarray
    tail_host_ns: np.ndarray
    op: np.ndarray
    bytes: np.ndarray  # -1 when unknown
    group_size: np.ndarray
    dim: np.ndarray  # per dense instance: breakdown_groups.dim of its group, None when unknown
    has_events: np.ndarray  # per span rank

    @property
    def measured_ns(self) -> np.ndarray:
        """Each span rank's measured step time."""
        return self.g.span_end_ns - self.g.span_start_ns

    def segments(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rank, start, end) on each rank's own clock of every work segment: the member rows' work
        (from its anchor to its issue) first, then one tail per span rank."""
        g = self.g
        tail_start = g.span_end_ns - self.tail
        off = self.offset_ns
        rank = np.r_[g.rank.astype(np.int64), g.span_rank]
        lo = np.r_[g.anchor_ns - off[g.row_span], tail_start - off]
        hi = np.r_[g.issue_ns - off[g.row_span], g.span_end_ns - off]
        return rank, lo, hi


# host_waited looks this long before a collective's end for a CPU op on the training thread: gloo's
# worker hands the result back within microseconds, and an op ending in that window was not waiting.
WAIT_PROBE_NS = 20_000


def prepare_host(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """(Re)make the temp table whatif_host_members (host.sql): each member's issue on the training
    thread, whether that thread waited for its end, and where it resumed before the end was recorded,
    on main-thread timelines."""
    run_sql_file(con, "bprof.whatif", "host.sql", {"run_id": run_id, "wait_probe_ns": WAIT_PROBE_NS,
                                                   "symmetric": list(SYMMETRIC_OPS)})


def has_analysis(con: duckdb.DuckDBPyConnection, run_id: int) -> bool:
    """Whether bprof analyze ran on the run: the tables the graph reads exist and hold its spans."""
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    if not {"timeline_spans", "match_instances", "match_members", "breakdown_idle_gaps", "breakdown_groups"} <= tables:
        return False
    return con.execute("SELECT count(*) FROM timeline_spans WHERE run_id = ?", [run_id]).fetchone()[0] > 0


def steps(con: duckdb.DuckDBPyConnection, run_id: int) -> Iterator[StepModel]:
    """The run's steps, one at a time (a 1,024-rank step holds millions of member rows)."""
    prepare_host(con, run_id)
    run_sql_file(con, "bprof.whatif", "graph.sql", {"run_id": run_id})
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    stage = dict(con.execute("SELECT rank, any_value(stage) FROM bubbles_stages WHERE run_id = ? GROUP BY rank",
                             [run_id]).fetchall()) if "bubbles_stages" in tables else {}
    with_events = {r for (r,) in con.execute(
        "SELECT rank FROM ranks WHERE run_id = ? AND coalesce(num_events, 0) > 0", [run_id]).fetchall()}
    if "reduced_ranks" in tables:
        with_events -= {r for (r,) in con.execute("SELECT rank FROM reduced_ranks WHERE run_id = ?", [run_id]).fetchall()}
    for (step,) in con.execute("SELECT DISTINCT step FROM _wi_spans ORDER BY step").fetchall():
        yield _build(con, run_id, step, stage, with_events)


def _build(con, run_id: int, step: int, stage: dict, with_events: set[int]) -> StepModel:
    m = {k: np.asarray(v) for k, v in con.execute("""
        SELECT dense_id, rank, arrival_ns, end_ns, role_id, issue_ns, host_waited FROM _wi_members WHERE step = ?""",
        [step]).fetchnumpy().items()}
    inst = {k: np.asarray(v) for k, v in con.execute("""
        SELECT dense_id, any_value(op) AS op, coalesce(any_value(bytes), -1) AS bytes, coalesce(any_value(group_size), 1) AS group_size,
            any_value(dim) AS dim
        FROM _wi_members WHERE step = ? GROUP BY dense_id ORDER BY dense_id""", [step]).fetchnumpy().items()}
    spans = {k: np.asarray(v) for k, v in con.execute(
        "SELECT rank, start_ns, end_ns, offset_ns FROM _wi_spans WHERE step = ? ORDER BY rank", [step]).fetchnumpy().items()}
    ids = np.arange(len(inst["dense_id"]), dtype=np.int64)
    g = StepGraph.build(m["dense_id"].astype(np.int64), m["rank"], m["arrival_ns"], m["end_ns"],
                        spans["rank"], spans["start_ns"], spans["end_ns"], instance_ids=ids, issue_ns=m["issue_ns"],
                        host_waited=m["host_waited"])
    role = m["role_id"][g.source_row].astype(np.int64)
    work, tail = work_segments(g)
    span_rank = g.span_rank.tolist()
    model = StepModel(
        step=step, g=g, role=role, stage=np.array([stage.get(r, -1) for r in span_rank], dtype=np.int64),
        offset_ns=spans["offset_ns"].astype(np.int64), work=work, tail=tail, exit_after=exit_offsets(g),
        host_ns=np.zeros(len(work), dtype=np.int64), tail_host_ns=np.zeros(len(tail), dtype=np.int64),
        op=inst["op"].astype(object), bytes=inst["bytes"].astype(np.int64), group_size=inst["group_size"].astype(np.int64),
        dim=_objects(inst["dim"]),
        has_events=np.array([r in with_events for r in span_rank], dtype=bool))
    if model.has_events.any():
        host = _host_gaps(con, run_id, model)
        model.host_ns, model.tail_host_ns = host[:len(work)], host[len(work):]
    return model


def _objects(column) -> np.ndarray:
    """A fetched VARCHAR column as an object array, None where NULL (fetchnumpy masks NULLs)."""
    mask = np.ma.getmaskarray(column)
    return np.where(mask, None, np.ma.getdata(column).astype(object))


# Host gaps: device idle (breakdown_idle_gaps: what idle.sql attributes to sync, GC, data loading,
# launch-bound and Python between ops) - and on CPU traces, where the main thread stands for the
# device and a data-loading range counts as `other`, not idle, the data-loading ranges too (the
# names idle.sql and phases.sql recognise). Their union, clipped to each segment.
_HOST_SQL = """
WITH gaps AS (
    SELECT g.rank, g.ts_ns, g.ts_ns + g.dur_ns AS end_ns FROM breakdown_idle_gaps g
    WHERE g.run_id = $run_id AND g.rank IN (SELECT rank FROM _wi_seg)
    UNION ALL
    SELECT e.rank, e.ts_ns, e.ts_ns + e.dur_ns FROM events e
    JOIN (SELECT DISTINCT rank FROM _wi_spans WHERE timeline = 'main_thread') t ON t.rank = e.rank
    WHERE e.run_id = $run_id AND e.kind IN ('user_annotation', 'cpu_op') AND e.dur_ns > 0
      AND (e.name LIKE 'enumerate(DataLoader)#%' OR lower(e.name) LIKE '%dataloader%')
)
SELECT s.seg_id, greatest(x.ts_ns, s.start_ns) AS ts_ns, least(x.end_ns, s.end_ns) AS end_ns
FROM _wi_seg s JOIN gaps x ON x.rank = s.rank AND x.ts_ns < s.end_ns AND x.end_ns > s.start_ns
"""

# The time of a kernel class or op name: kernels (device timelines) or CPU ops on the main thread
# (CPU traces) whose name is in $names, their union clipped to each segment.
_MATCH_SQL = """
SELECT s.seg_id, greatest(e.ts_ns, s.start_ns) AS ts_ns, least(e.ts_ns + e.dur_ns, s.end_ns) AS end_ns
FROM _wi_seg s
JOIN (SELECT DISTINCT rank, timeline, main_tid FROM _wi_spans) t ON t.rank = s.rank
JOIN events e ON e.rank = s.rank AND e.ts_ns < s.end_ns AND e.ts_ns + e.dur_ns > s.start_ns
WHERE e.run_id = $run_id AND e.dur_ns > 0 AND list_contains($names, e.name)
  AND ((t.timeline = 'device' AND e.kind = 'kernel') OR (t.timeline = 'main_thread' AND e.kind = 'cpu_op' AND e.tid = t.main_tid))
"""


def _host_gaps(con, run_id: int, model: StepModel) -> np.ndarray:
    return _per_segment(con, model, _HOST_SQL, {"run_id": run_id})


# The host gaps of one cause (idle_segments.cause: sync, gc, data_loading, launch_bound, host_other;
# bprof/analyzers/idle.sql) - for data_loading on CPU traces, the data-loading ranges too.
_CAUSE_SQL = """
WITH gaps AS (
    SELECT g.rank, g.ts_ns, g.ts_ns + g.dur_ns AS end_ns FROM idle_segments g
    WHERE g.run_id = $run_id AND g.cause = $cause AND g.rank IN (SELECT rank FROM _wi_seg)
    UNION ALL
    SELECT e.rank, e.ts_ns, e.ts_ns + e.dur_ns FROM events e
    JOIN (SELECT DISTINCT rank FROM _wi_spans WHERE timeline = 'main_thread') t ON t.rank = e.rank
    WHERE $cause = 'data_loading' AND e.run_id = $run_id AND e.kind IN ('user_annotation', 'cpu_op') AND e.dur_ns > 0
      AND (e.name LIKE 'enumerate(DataLoader)#%' OR lower(e.name) LIKE '%dataloader%')
)
SELECT s.seg_id, greatest(x.ts_ns, s.start_ns) AS ts_ns, least(x.end_ns, s.end_ns) AS end_ns
FROM _wi_seg s JOIN gaps x ON x.rank = s.rank AND x.ts_ns < s.end_ns AND x.end_ns > s.start_ns
"""


def cause_gaps(con: duckdb.DuckDBPyConnection, run_id: int, model: StepModel, cause: str) -> np.ndarray:
    """Per work segment (member rows, then tails), the host gaps of `cause` in it (idle_segments,
    which bprof analyze's idle analysis writes; without it, only the data-loading ranges)."""
    if not model.has_events.any():
        return np.zeros(len(model.work) + len(model.tail), dtype=np.int64)
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE NOT temporary").fetchall()}
    sql = _CAUSE_SQL if "idle_segments" in tables else _CAUSE_SQL.replace("FROM idle_segments g", "FROM (\n        "
        "SELECT NULL::INTEGER AS run_id, NULL::INTEGER AS rank, NULL::BIGINT AS ts_ns, NULL::BIGINT AS dur_ns, "
        "NULL::VARCHAR AS cause WHERE false) g")
    return _per_segment(con, model, sql, {"run_id": run_id, "cause": cause})


def matched_time(con: duckdb.DuckDBPyConnection, run_id: int, model: StepModel, names: list[str]) -> np.ndarray:
    """Per work segment (member rows, then tails), the time of the events named `names` in it."""
    if not names or not model.has_events.any():
        return np.zeros(len(model.work) + len(model.tail), dtype=np.int64)
    return _per_segment(con, model, _MATCH_SQL, {"run_id": run_id, "names": names})


def _per_segment(con, model: StepModel, sql: str, params: dict) -> np.ndarray:
    """Union length, per segment, of the intervals `sql` returns (seg_id, ts_ns, end_ns)."""
    rank, lo, hi = model.segments()
    keep = np.isin(rank, model.g.span_rank[model.has_events]) & (hi > lo)
    seg = pa.table({"seg_id": pa.array(np.flatnonzero(keep), pa.int64()), "rank": pa.array(rank[keep], pa.int32()),
                    "start_ns": pa.array(lo[keep], pa.int64()), "end_ns": pa.array(hi[keep], pa.int64())})
    con.register("_wi_seg_frame", seg)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _wi_seg AS SELECT * FROM _wi_seg_frame")
    finally:
        con.unregister("_wi_seg_frame")
    # Algorithm: gaps and islands per segment: an interval starts a new island when it begins after
    # the running maximum end of the intervals before it; the islands' lengths sum to the union.
    rows = con.execute(f"""
        WITH iv AS ({sql}), ordered AS (
            SELECT seg_id, ts_ns, end_ns, max(end_ns) OVER (PARTITION BY seg_id ORDER BY ts_ns, end_ns
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end FROM iv WHERE end_ns > ts_ns
        ), islands AS (
            SELECT *, sum(CASE WHEN prev_end IS NULL OR ts_ns > prev_end THEN 1 ELSE 0 END)
                OVER (PARTITION BY seg_id ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island FROM ordered
        )
        SELECT seg_id, CAST(sum(len) AS BIGINT) AS ns FROM (
            SELECT seg_id, max(end_ns) - min(ts_ns) AS len FROM islands GROUP BY seg_id, island) GROUP BY seg_id""",
        params).fetchnumpy()
    out = np.zeros(len(rank), dtype=np.int64)
    out[np.asarray(rows["seg_id"], dtype=np.int64)] = np.asarray(rows["ns"], dtype=np.int64)
    return out
