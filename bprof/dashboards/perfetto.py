"""`bprof export RUN --perfetto FILE`: one step of up to 64 ranks as one Chrome-trace JSON on the
aligned clock, with arrows between the members of each matched collective, for ui.perfetto.dev or
chrome://tracing. Read-only over the store; the file re-ingests (bprof.store.chrome_export).
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import duckdb
import orjson

from bprof.errors import UsageError
from bprof.store.ingest import rank_ranges
from bprof.store.chrome_export import (CALL_FIELDS, CALL_KEY, EXPORT_KEY, FLOW_CAT, FORMAT, FORMAT_VERSION,
                                       ORIGINAL_ID_KEY)

MAX_RANKS = 64
TID_STRIDE = 1 << 16  # export tid = (rank + 1) * TID_STRIDE + thread index: never a rank (a pid), unique in the file
_BATCH_ROWS = 50_000

# The chosen ranks' events of the step: those the store assigned to it (GPU rows by their launch),
# and those of no step that overlap the rank's step span (timeline_spans); events of other steps
# are left out even where they overlap (a kernel of the step before, still running).
_WINDOW = """
WITH win AS (
    SELECT s.rank, s.ts_ns AS start_ns, s.ts_ns + s.dur_ns AS end_ns, coalesce(k.clock_offset_ns, 0) AS offset_ns
    FROM timeline_spans s JOIN ranks k ON k.run_id = s.run_id AND k.rank = s.rank
    WHERE s.run_id = $run_id AND s.step = $step AND list_contains($ranks, s.rank)
), chosen AS (
    SELECT e.*, e.rowid AS row_id, w.offset_ns
    FROM events e JOIN win w ON e.rank = w.rank
    WHERE e.run_id = $run_id AND list_contains($ranks, e.rank) AND e.kind <> 'metadata'
      AND (e.step = $step OR e.step IS NULL AND e.ts_ns < w.end_ns AND greatest(e.ts_ns + e.dur_ns, e.ts_ns + 1) > w.start_ns)
)"""

_EVENTS = _WINDOW + """, calls AS (
    SELECT * FROM collectives WHERE run_id = $run_id AND list_contains($ranks, rank) AND cpu_ts_ns IS NOT NULL
)
SELECT e.rank, e.kind, e.cat, e.name, e.pid, e.tid, e.device, e.stream, e.ts_ns + e.offset_ns AS ts_aligned_ns,
       e.ts_ns, e.dur_ns, e.correlation, CAST(e.args AS VARCHAR) AS args,
       CASE WHEN c.rank IS NOT NULL THEN to_json(struct_pack(op := c.op, pg_name := c.pg_name, pg_desc := c.pg_desc,
            pg_ranks := c.pg_ranks, group_size := c.group_size, seq := c.seq, peer_rank := c.peer_rank,
            dtype := c.dtype, in_elems := c.in_elems, out_elems := c.out_elems, in_bytes := c.in_bytes,
            out_bytes := c.out_bytes))::VARCHAR END AS call
FROM chosen e
LEFT JOIN calls c ON e.kind = 'cpu_op' AND c.rank = e.rank AND c.tid = e.tid AND c.cpu_ts_ns = e.ts_ns
     AND c.cpu_dur_ns = e.dur_ns AND (e.name = c.raw_name OR c.source = 'record_param_comms' AND e.name = 'record_param_comms')
ORDER BY e.rank, ts_aligned_ns, e.row_id"""

# The members of each matched instance of the step among the chosen ranks, with the events that
# stand for their arrival: the device work (NCCL kernel or gloo range) and the CPU call.
_MEMBERS = """
SELECT m.instance_id, i.op, i.pg_name, i.pg_desc, i.seq, i.is_p2p, i.src_rank, i.status, m.rank,
       coalesce(m.arrival_ts_ns + k.clock_offset_ns, m.arrival_ts_ns) AS arrival_ns,
       (SELECT arg_max([e.pid, e.tid, CAST(e.ts_ns AS VARCHAR), CAST(e.dur_ns AS VARCHAR)], e.dur_ns) FROM events e
        WHERE e.run_id = $run_id AND e.rank = m.rank AND e.ts_ns = c.device_ts_ns
          AND (e.kind = 'kernel' AND (lower(e.name) LIKE 'nccl%' OR lower(e.name) LIKE 'rccl%')
               OR e.kind = 'user_annotation' AND e.name LIKE 'gloo:%')) AS device_event,
       (SELECT arg_max([e.pid, e.tid, CAST(e.ts_ns AS VARCHAR), CAST(e.dur_ns AS VARCHAR)], e.dur_ns) FROM events e
        WHERE e.run_id = $run_id AND e.rank = m.rank AND e.ts_ns = c.cpu_ts_ns AND e.kind = 'cpu_op'
          AND e.tid = c.tid AND e.dur_ns = c.cpu_dur_ns) AS cpu_event
FROM match_members m
JOIN match_instances i ON i.run_id = m.run_id AND i.instance_id = m.instance_id
JOIN collectives c ON c.run_id = m.run_id AND c.rank = m.rank AND c.call_index = m.call_index
JOIN ranks k ON k.run_id = m.run_id AND k.rank = m.rank
WHERE m.run_id = $run_id AND coalesce(m.step, -1) = $step AND list_contains($ranks, m.rank)
ORDER BY m.instance_id, arrival_ns, m.rank"""


def export_perfetto(con: duckdb.DuckDBPyConnection, run_id: int, path: Path, step: int | None = None,
                    ranks: list[int] | None = None) -> dict:
    """Write one step of `ranks` of an analysed run to `path` (gzip when it ends in .gz) as a Chrome
    trace; returns what was written (path, step, ranks, events, threads, flows, bytes, ...).

    ranks: default every rank of the run when it has at most 64 (else a usage error asking for
    some); more than 64, an unknown rank or one without events is a usage error too.
    step: default the step of median length: among the steps every chosen rank captured (in
    timeline_spans), the one whose longest span over the chosen ranks is the lower median (the
    earlier step on ties); a step one chosen rank did not capture is a usage error.
    The run must have been analysed (`bprof analyze`): the step spans, matched collectives and
    clock offsets come from there. Times are ts_ns + the rank's clock_offset_ns (the host's offset
    that clock alignment found); ranks whose host could not be aligned are exported on their own
    clock and listed under `unaligned_ranks`.
    """
    path = Path(path)
    _require_analysis(con, run_id)
    ranks = _choose_ranks(con, run_id, ranks)
    step = _choose_step(con, run_id, ranks, step)
    params = {"run_id": run_id, "step": step, "ranks": ranks}
    base_ns = con.execute(_WINDOW + " SELECT min(ts_ns + offset_ns) FROM chosen", params).fetchone()[0]
    if base_ns is None:
        raise UsageError(f"step {step} of ranks {rank_ranges(ranks)} has no events to export")
    rank_rows = _rank_rows(con, run_id, ranks, step)
    thread_names = _thread_names(con, run_id, ranks)
    writer = _Writer(path)
    threads: dict[tuple, int] = {}  # (rank, raw pid, raw tid) -> export tid
    thread_info: dict[tuple, tuple] = {}  # same key -> (device, stream)
    flow_ids: dict[tuple, int] = {}
    anchors: set[tuple] = set()  # (rank, pid, tid, ts_ns) of every event written
    num_events = num_calls = 0
    try:
        cur = con.execute(_EVENTS, params)
        while batch := cur.fetchmany(_BATCH_ROWS):
            for rank, kind, cat, name, pid, tid, device, stream, ts_aligned, ts_ns, dur_ns, corr, args, call in batch:
                key = (rank, pid, tid)
                if key not in threads:
                    threads[key] = _export_tid(rank, sum(1 for k in threads if k[0] == rank))
                    thread_info[key] = (device, stream)
                event = {"ph": _PHASES.get(kind, "X"), "cat": cat, "name": name, "pid": rank, "tid": threads[key],
                         "ts": (ts_aligned - base_ns) / 1000}
                if event["ph"] == "X":
                    event["dur"] = dur_ns / 1000
                elif event["ph"] in ("s", "f"):
                    flow_key = (rank, cat, name, corr) if corr is not None else (rank, cat, name, "row", len(flow_ids))
                    event["id"] = flow_ids.setdefault(flow_key, len(flow_ids) + 1)
                    event[ORIGINAL_ID_KEY] = corr
                    if event["ph"] == "f":
                        event["bp"] = "e"
                if call is not None:
                    merged = orjson.loads(args) if args is not None else {}
                    merged[CALL_KEY] = orjson.loads(call)
                    event["args"] = merged
                    num_calls += 1
                elif args is not None:
                    event["args"] = orjson.Fragment(args)  # valid JSON text from DuckDB, written as is
                writer.event(event)
                anchors.add((rank, pid, tid, ts_ns))
                num_events += 1
        flows = _flow_events(con, params, rank_rows, threads, anchors, base_ns)
        for event in flows:
            writer.event(event)
        for event in _metadata_events(rank_rows, threads, thread_info, thread_names):
            writer.event(event)
        header = {
            "format": FORMAT, "version": FORMAT_VERSION, "step": step, "base_time_ns": base_ns,
            "clock": "aligned: own clock + ranks.clock_offset_ns",
            "run": _run_row(con, run_id),
            "ranks": [{**{k: v for k, v in r.items() if k not in ("offset_ns",)},
                       "threads": [{"tid": t, "pid": k[1], "raw_tid": k[2]}
                                   for k, t in sorted(threads.items(), key=lambda kv: kv[1]) if k[0] == r["rank"]]}
                      for r in rank_rows.values()],
        }
        num_bytes = writer.close(header)
    except BaseException:
        writer.abort()
        raise
    return {"path": str(path), "run": run_id, "step": step, "ranks": ranks, "events": num_events,
            "threads": len(threads), "collective_calls": num_calls,
            "flows": len({e["id"] for e in flows if e["ph"] == "s"}),
            "unaligned_ranks": [r for r, row in rank_rows.items() if row["clock_offset_ns"] is None],
            "bytes": num_bytes}


_PHASES = {"flow_start": "s", "flow_end": "f", "instant": "i"}


def _require_analysis(con, run_id: int) -> None:
    tables = {t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    if not {"timeline_spans", "match_members", "match_instances"} <= tables or not con.execute(
            "SELECT count(*) FROM timeline_spans WHERE run_id = ?", [run_id]).fetchone()[0]:
        raise UsageError(f"run {run_id} has not been analysed: run `bprof analyze {run_id}` first "
                         "(the export takes its step spans, matched collectives and clock offsets from there)")


def _choose_ranks(con, run_id: int, ranks: list[int] | None) -> list[int]:
    have = [r for (r,) in con.execute("SELECT rank FROM ranks WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()]
    if ranks is None:
        if len(have) > MAX_RANKS:
            raise UsageError(f"run {run_id} has {len(have)} ranks; choose at most {MAX_RANKS} with --ranks (e.g. --ranks 0-7)")
        ranks = have
    ranks = sorted(set(ranks))
    if len(ranks) > MAX_RANKS:
        raise UsageError(f"{len(ranks)} ranks chosen; a Perfetto export holds at most {MAX_RANKS}")
    unknown = [r for r in ranks if r not in set(have)]
    if unknown:
        raise UsageError(f"rank {unknown[0]} is not in run {run_id} (its ranks: {rank_ranges(have)})")
    reduced = [r for (r,) in con.execute("SELECT rank FROM reduced_ranks WHERE run_id = ? AND list_contains(?, rank) "
                                         "ORDER BY rank", [run_id, ranks]).fetchall()]
    if reduced:
        raise UsageError(f"rank {reduced[0]} was ingested from a `bprof reduce` output and has no events to export")
    return ranks


def _choose_step(con, run_id: int, ranks: list[int], step: int | None) -> int:
    captured = dict(con.execute("""SELECT rank, list(step ORDER BY step) FROM timeline_spans
                                   WHERE run_id = ? AND list_contains(?, rank) GROUP BY rank""",
                                [run_id, ranks]).fetchall())
    if step is not None:
        for r in ranks:
            if step not in captured.get(r, []):
                raise UsageError(f"step {step} was not captured on rank {r} (its steps: {rank_ranges(captured.get(r, [])) or 'none'})")
        return step
    row = con.execute("""
        WITH common AS (
            SELECT step, max(dur_ns) AS job_ns FROM timeline_spans WHERE run_id = ? AND list_contains(?, rank)
            GROUP BY step HAVING count(*) = ?
        )
        SELECT step FROM common ORDER BY job_ns, step
        LIMIT 1 OFFSET (SELECT (count(*) - 1) // 2 FROM common)""", [run_id, ranks, len(ranks)]).fetchone()
    if row is None:
        raise UsageError(f"ranks {rank_ranges(ranks)} captured no step in common; choose other --ranks")
    return row[0]


def _rank_rows(con, run_id: int, ranks: list[int], step: int) -> dict[int, dict]:
    cur = con.execute("""SELECT k.rank, k.host, k.local_rank, k.device_name, k.clock_offset_ns, k.clock_residual_ns,
                                CAST(k.distributed_info AS VARCHAR), CAST(k.device_properties AS VARCHAR), s.main_tid
                         FROM ranks k LEFT JOIN timeline_spans s ON s.run_id = k.run_id AND s.rank = k.rank AND s.step = ?
                         WHERE k.run_id = ? AND list_contains(?, k.rank) ORDER BY k.rank""", [step, run_id, ranks])
    out = {}
    for rank, host, local_rank, device, offset, residual, dist, props, main_tid in cur.fetchall():
        out[rank] = {"rank": rank, "host": host, "local_rank": local_rank, "device_name": device,
                     "clock_offset_ns": offset, "clock_residual_ns": residual, "main_tid": main_tid,
                     "distributedInfo": orjson.loads(dist) if dist else None,
                     "deviceProperties": orjson.loads(props) if props else None}
    return out


def _run_row(con, run_id: int) -> dict:
    cur = con.execute("""SELECT run_id AS id, name, world_size, backend, command, git_sha, git_branch,
                                model_flops_per_step FROM runs WHERE run_id = ?""", [run_id])
    return dict(zip([d[0] for d in cur.description], cur.fetchone()))


def _thread_names(con, run_id: int, ranks: list[int]) -> dict[tuple, str]:
    """Kineto's thread_name metadata: (rank, pid, tid) -> name."""
    return {(r, pid, tid): name for r, pid, tid, name in con.execute(
        """SELECT rank, pid, tid, any_value(args ->> '$.name') FROM events
           WHERE run_id = ? AND list_contains(?, rank) AND kind = 'metadata' AND name = 'thread_name'
             AND args ->> '$.name' IS NOT NULL GROUP BY ALL""", [run_id, ranks]).fetchall()}


def _export_tid(rank: int, index: int) -> int:
    tid = (rank + 1) * TID_STRIDE + index
    if index >= TID_STRIDE or tid >= 1 << 32:  # Perfetto reads tids as uint32
        raise UsageError(f"rank {rank} has too many threads or too high a rank number for a Chrome trace")
    return tid


def _flow_events(con, params: dict, rank_rows: dict, threads: dict, anchors: set, base_ns: int) -> list[dict]:
    """Arrows through the members of each instance with at least two of the chosen ranks: in arrival
    order (sender first for p2p), bound to the event of each member's arrival."""
    by_instance: dict[int, list] = {}
    for (instance_id, op, pg_name, pg_desc, seq, is_p2p, src, status, rank, arrival_ns,
         device_event, cpu_event) in con.execute(_MEMBERS, params).fetchall():
        anchor = next((e for e in (device_event, cpu_event)
                       if e is not None and (rank, e[0], e[1], int(e[2])) in anchors), None)
        if anchor is None:
            continue
        label = " ".join(str(p) for p in ("p2p" if is_p2p else op, pg_desc or pg_name, f"#{seq}" if seq is not None else None,
                                                    None if status == "complete" else f"({status})") if p)
        by_instance.setdefault(instance_id, []).append((is_p2p and rank != src, arrival_ns, rank, anchor, label))
    out = []
    for flow_id, (instance_id, members) in enumerate(sorted(by_instance.items()), start=1):
        if len(members) < 2:
            continue
        members.sort(key=lambda m: m[:3])
        for i, (_, _, rank, (pid, tid, ts_ns, dur_ns), label) in enumerate(members):
            offset = rank_rows[rank]["clock_offset_ns"] or 0
            # inside the slice, so that Perfetto binds the flow to it whatever the order of equal timestamps
            point_ns = int(ts_ns) + offset + int(dur_ns) // 2
            ph = "s" if i == 0 else "f" if i == len(members) - 1 else "t"
            event = {"ph": ph, "cat": FLOW_CAT, "name": label, "id": flow_id, "pid": rank,
                     "tid": threads[(rank, pid, tid)], "ts": (point_ns - base_ns) / 1000}
            if ph == "f":
                event["bp"] = "e"
            out.append(event)
    return out


def _metadata_events(rank_rows: dict, threads: dict, thread_info: dict, thread_names: dict) -> list[dict]:
    out = []
    for rank, r in rank_rows.items():
        out.append({"ph": "M", "name": "process_name", "pid": rank,
                    "args": {"name": f"rank {rank} · {r['host'] or 'unknown host'}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}})
        mine = [k for k in threads if k[0] == rank]

        def order(key):
            device, stream = thread_info[key]
            return (0 if device is None and key[2] == r["main_tid"] else 1 if device is None else 2,
                    device or 0, stream or 0, str(key[1]), str(key[2]))

        for index, key in enumerate(sorted(mine, key=order)):
            device, stream = thread_info[key]
            if device is not None:
                name = f"GPU {device} · stream {stream}"
            else:
                name = thread_names.get(key) or f"thread {key[2]}"
                if key[2] == r["main_tid"]:
                    name += " · main"
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": threads[key], "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": threads[key],
                        "args": {"sort_index": index}})
    return out


class _Writer:
    """Streams `{"traceEvents": [...], "bprofExport": {...}}` to a temporary file and moves it into
    place on close, so a failed export leaves nothing behind. Every value is encoded by orjson; only
    the envelope's constant punctuation is written here. One event per line: bprof's ingest cuts
    large arrays at line breaks between events."""

    def __init__(self, path: Path):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        try:
            self.f = gzip.open(self.tmp, "wb", compresslevel=6) if path.name.endswith(".gz") else self.tmp.open("wb")
        except OSError as exc:
            raise UsageError(f"{path}: cannot write ({exc.strerror})") from None
        self.f.write(b'{"traceEvents":[\n')
        self.first = True

    def event(self, event: dict) -> None:
        if not self.first:
            self.f.write(b",\n")
        self.first = False
        self.f.write(orjson.dumps(event))

    def close(self, header: dict) -> int:
        self.f.write(b'\n],\n"' + EXPORT_KEY.encode() + b'":')
        self.f.write(orjson.dumps(header))
        self.f.write(b"}\n")
        self.f.close()
        os.replace(self.tmp, self.path)
        return self.path.stat().st_size

    def abort(self) -> None:
        self.f.close()
        self.tmp.unlink(missing_ok=True)
