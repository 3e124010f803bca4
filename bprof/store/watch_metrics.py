"""`bprof export RUN --prometheus FILE`: a finished watched recording's metrics, built from the
store as the Snapshot the live endpoint serves (bprof.watch.metrics), so a dashboard reads either.

What each Snapshot field is here, against the live one (bprof.watch.live.LiveWatch.snapshot):
    run               the run directory's name, as live labels it
    iteration         live.json's newest complete iteration (else the newest every rank has a row of)
    step_ns           a rank's last RECENT_STEPS rows by (attempt, iteration), as live keeps them
    own_ns, score     the rank's last live score (watch_scores)
    data_wait, gc     summed over every row of the rank
    blocked_ns        summed over watch_groups per (rank, group, description)
    windows_triggered the rows of watch_triggers
    model_flops       --model-flops as live had it (live.json options), else the window runs' declared
                      model FLOPs a step, where one declared them
    median_step_ns    the median job step (slowest rank's) over the last RECENT_STEPS iterations past the
                      warm-up with no window open; live also leaves out slow steps its step rule held
"""

from __future__ import annotations

import json
from pathlib import Path

import duckdb

from bprof.watch.metrics import RankMetrics, Snapshot

RECENT_STEPS = 200  # as live keeps (bprof.watch.live: deque(maxlen=200))


def snapshot(con: duckdb.DuckDBPyConnection, recording_id: int) -> Snapshot:
    source, newest, options = con.execute(
        "SELECT source_path, newest_complete_iteration, options FROM watch_recordings WHERE recording_id = ?",
        [recording_id]).fetchone()
    options = json.loads(options) if options else {}
    warmup = int(options.get("warmup", 0))
    if newest is None:
        newest = con.execute("""SELECT min(last) FROM (SELECT max(iteration) AS last FROM watch_steps
                                WHERE recording_id = ? GROUP BY rank)""", [recording_id]).fetchone()[0]
    ranks = []
    for rank, host, recent, data_ns, gc_ns, own_ns, score in con.execute("""
            SELECT s.rank, any_value(s.host),
                   list(s.step_ns ORDER BY s.attempt DESC, s.iteration DESC)[1:$recent],
                   sum(s.data_wait_ns), sum(s.gc_ns), any_value(w.own_ns), any_value(w.score)
            FROM watch_steps s LEFT JOIN watch_scores w ON w.recording_id = s.recording_id AND w.rank = s.rank
            WHERE s.recording_id = $id GROUP BY s.rank ORDER BY s.rank""",
            {"id": recording_id, "recent": RECENT_STEPS}).fetchall():
        ranks.append(RankMetrics(rank, host or "", list(reversed(recent)), own_ns, score, int(data_ns), int(gc_ns)))
    blocked = {(rank, name, desc): int(ns) for rank, name, desc, ns in con.execute("""
        SELECT rank, pg_name, pg_desc, sum(blocked_ns) FROM watch_groups WHERE recording_id = ?
        GROUP BY ALL ORDER BY ALL""", [recording_id]).fetchall()}
    triggered = con.execute("SELECT count(*) FROM watch_triggers WHERE recording_id = ?", [recording_id]).fetchone()[0]
    flops = options.get("model_flops_per_step") or con.execute(
        """SELECT max(r.model_flops_per_step) FROM watch_windows w JOIN runs r USING (run_id)
           WHERE w.recording_id = ?""", [recording_id]).fetchone()[0]
    median_step = con.execute("""
        SELECT median(step_ns) FROM (
            SELECT iteration, max(step_ns) AS step_ns FROM watch_steps WHERE recording_id = $id AND iteration >= $warmup
            GROUP BY iteration HAVING NOT bool_or(windowed) ORDER BY iteration DESC LIMIT $recent)""",
                              {"id": recording_id, "warmup": warmup, "recent": RECENT_STEPS}).fetchone()[0]
    return Snapshot(Path(source).name, -1 if newest is None else int(newest), ranks, blocked, int(triggered),
                    flops, median_step)


def write_prometheus(con: duckdb.DuckDBPyConnection, recording_id: int, path: Path) -> dict:
    """The recording's metrics in Prometheus's text format at `path`; what was written."""
    from bprof.watch.metrics import text

    snap = snapshot(con, recording_id)
    body = text(snap)
    Path(path).write_text(body)
    samples = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    return {"path": str(path), "recording": recording_id, "run": snap.run, "samples": samples,
            "bytes": len(body.encode())}
