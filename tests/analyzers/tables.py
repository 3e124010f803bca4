"""Tiny hand-built runs for exact analyzer tests: a store with the rows a test names, nothing else."""

from __future__ import annotations

import json
from pathlib import Path

from bprof.store.db import open_store

EVENT_COLUMNS = ("rank", "kind", "name", "tid", "ts_ns", "dur_ns", "correlation", "step", "args", "stream")


def tiny_store(path: Path, *, ranks: int | list[int] = 1, events=(), steps=(), world_size: int | None = None,
               model: dict | None = None, host: str | None = "h0", device_properties: list | None = None):
    """A store with one run. `events`: dicts with EVENT_COLUMNS keys (kind, name, ts_ns, dur_ns required);
    `steps`: (rank, step, ts_ns, dur_ns) tuples. Returns (con, run_id)."""
    con = open_store(path)
    rank_list = list(range(ranks)) if isinstance(ranks, int) else list(ranks)
    run_id = con.execute(
        """INSERT INTO runs (name, ingested_at, source_path, fingerprint, world_size, num_ranks_ingested, consistent, metadata)
           VALUES ('tiny', now(), 'hand-built', 'fp-tiny', ?, ?, true, ?) RETURNING run_id""",
        [world_size or len(rank_list), len(rank_list), json.dumps({"bprof_model": model})]).fetchone()[0]
    for r in rank_list:
        con.execute("""INSERT INTO ranks (run_id, rank, host, device_index, trace_path, trace_sha256, trace_bytes,
                       time_base, base_time_ns, num_events, device_properties)
                       VALUES (?, ?, ?, ?, 'x', 'x', 0, 'absolute_us', 0, 0, ?)""",
                    [run_id, r, host, 0 if device_properties else None,
                     json.dumps(device_properties) if device_properties else None])
    for e in events:
        e = {"rank": 0, "tid": "1", "correlation": None, "step": None, "args": None, "stream": None, **e}
        on_device = e["kind"] in ("kernel", "gpu_memcpy", "gpu_memset")
        con.execute("""INSERT INTO events (run_id, rank, kind, name, tid, device, stream, ts_ns, dur_ns, correlation, step, args)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    [run_id, e["rank"], e["kind"], e["name"], e["tid"], 0 if on_device else None,
                     e["stream"] if e["stream"] is not None else (7 if on_device else None), e["ts_ns"], e["dur_ns"],
                     e["correlation"], e["step"], json.dumps(e["args"]) if e["args"] is not None else None])
    for rank, step, ts, dur in steps:
        con.execute("INSERT INTO steps (run_id, rank, step, ts_ns, dur_ns) VALUES (?, ?, ?, ?, ?)", [run_id, rank, step, ts, dur])
        con.execute("""INSERT INTO events (run_id, rank, kind, name, tid, ts_ns, dur_ns, step)
                       VALUES (?, ?, 'user_annotation', ?, '1', ?, ?, ?)""", [run_id, rank, f"ProfilerStep#{step}", ts, dur, step])
    # as ingest counts them (the what-if graph reads a rank without events as reduced)
    con.execute("""UPDATE ranks SET num_events = (SELECT count(*) FROM events e WHERE e.run_id = ranks.run_id
                   AND e.rank = ranks.rank) WHERE run_id = ?""", [run_id])
    return con, run_id
