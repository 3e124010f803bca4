"""Read-side queries over the store: find a run, list runs, describe one run."""

from __future__ import annotations

import json

import duckdb

from bprof.errors import UsageError

MAX_LISTED_COLLECTIVES = 1000


def resolve_run(con: duckdb.DuckDBPyConnection, run: str | int | None) -> int:
    """A run id, a run name, or None for the latest run; a usage error when there is none."""
    if run is None:
        row = con.execute("SELECT max(run_id) FROM runs").fetchone()
        if row[0] is None:
            raise UsageError("the store has no runs yet (run `bprof ingest PATH` first)")
        return row[0]
    text = str(run)
    row = con.execute("SELECT run_id FROM runs WHERE name = ?", [text]).fetchone()
    if row is None and text.isdigit():
        row = con.execute("SELECT run_id FROM runs WHERE run_id = ?", [int(text)]).fetchone()
    if row is None:
        raise UsageError(f"no run {text!r} in this store (see `bprof runs`)")
    return row[0]


def list_runs(con: duckdb.DuckDBPyConnection) -> list[dict]:
    """One dict per run, oldest first."""
    return _dicts(con.execute("""
        SELECT r.run_id AS id, r.name, CAST(r.started_at AS VARCHAR) AS started_at,
               CAST(r.ingested_at AS VARCHAR) AS ingested_at, r.world_size, r.num_ranks_ingested,
               r.backend, r.device_name, r.consistent, r.inconsistency,
               (SELECT count(DISTINCT step) FROM steps s WHERE s.run_id = r.run_id) AS num_steps,
               -- the step on the device where it was measured (steps.device_dur_ns), else the CPU range
               (SELECT median(coalesce(device_dur_ns, dur_ns)) FROM steps s WHERE s.run_id = r.run_id) AS median_step_ns
        FROM runs r ORDER BY r.run_id"""))


def run_info(con: duckdb.DuckDBPyConnection, run_id: int) -> dict:
    """Everything `bprof info` shows: the run, its ranks, steps, event kinds and collectives."""
    run = _dicts(con.execute("""
        SELECT run_id AS id, name, CAST(started_at AS VARCHAR) AS started_at, source_path, world_size,
               num_ranks_ingested, backend, device_name, model_flops_per_step, consistent, inconsistency,
               command, git_sha, git_branch, tags
        FROM runs WHERE run_id = ?""", [run_id]))[0]
    run["ranks"] = _dicts(con.execute("""
        SELECT k.rank, k.local_rank, k.host, k.device_name, k.device_index, k.trace_path, k.trace_bytes,
               k.time_base, k.num_events,
               (SELECT list(step ORDER BY step) FROM steps s WHERE s.run_id = k.run_id AND s.rank = k.rank) AS steps
        FROM ranks k WHERE run_id = ? ORDER BY rank""", [run_id]))
    run["events_by_kind"] = dict(con.execute(
        "SELECT kind, count(*) FROM events WHERE run_id = ? GROUP BY kind ORDER BY count(*) DESC", [run_id]
    ).fetchall())
    run["collectives_by_op"] = _dicts(con.execute("""
        SELECT op, pg_desc, pg_ranks, count(*) AS calls, sum(in_bytes) AS in_bytes, sum(out_bytes) AS out_bytes,
               count(DISTINCT rank) AS ranks
        FROM collectives WHERE run_id = ? GROUP BY ALL ORDER BY calls DESC, op""", [run_id]))
    calls = _dicts(con.execute("""
        SELECT rank, call_index, op, source, pg_name, pg_desc, pg_ranks, group_size, seq, dtype,
               in_elems, out_elems, in_bytes, out_bytes, num_parts, cpu_ts_ns, cpu_dur_ns,
               device_ts_ns, device_dur_ns, num_kernels, step
        FROM collectives WHERE run_id = ? ORDER BY rank, call_index LIMIT ?""",
        [run_id, MAX_LISTED_COLLECTIVES + 1]))
    run["collectives_truncated"] = len(calls) > MAX_LISTED_COLLECTIVES
    run["collectives"] = calls[:MAX_LISTED_COLLECTIVES]
    return run


def _dicts(cursor: duckdb.DuckDBPyConnection) -> list[dict]:
    names = [d[0] for d in cursor.description]
    rows = []
    for values in cursor.fetchall():
        row = dict(zip(names, values))
        for key, value in row.items():
            if isinstance(value, str) and key in ("tags",):
                row[key] = json.loads(value)
        rows.append(row)
    return rows
