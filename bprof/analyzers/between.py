"""Between windows: what a watched recording's ranks did between its trace windows, when it went
wrong, and what each window the watch opened found.

Reads watch_recordings, watch_steps, watch_scores, watch_episodes, watch_triggers, watch_windows
(bprof.store.ingest_watch), and runs and findings of the window runs; writes nothing: the series is
a store table already, and the view is a few aggregates over it, so it is the same whether or not
the window runs were analysed (their findings show once they are).

Per rank: its step time (median, p90, and its worst iterations) and its own time (busy_ns +
data_idle_ns: what the live score compares), over the iterations without a trace window open
(a window's profiler inflates every rank). The job's step of an iteration is its slowest rank's.
"""

from __future__ import annotations

import json

import duckdb

from bprof.errors import UsageError

WORST_ITERATIONS = 3  # per rank, the slowest iterations listed
TOP_FINDINGS = 3  # of each window run, shown beside the trigger's reason

# Algorithm: one pass over the recording's rows without a window open, grouped by rank; the worst
# iterations are the rank's rows ordered by step_ns (ties: the earlier iteration), the first few.
RANKS_SQL = """
WITH rows AS (
    SELECT rank, host, iteration, step_ns, busy_ns + data_idle_ns AS own_ns, windowed
    FROM watch_steps WHERE recording_id = $id
)
SELECT r.rank, any_value(r.host) AS host,
       count(*) FILTER (WHERE NOT r.windowed) AS num_iterations,
       count(*) FILTER (WHERE r.windowed) AS num_windowed,
       median(r.step_ns) FILTER (WHERE NOT r.windowed) AS median_step_ns,
       quantile_cont(r.step_ns, 0.9) FILTER (WHERE NOT r.windowed) AS p90_step_ns,
       max(r.step_ns) FILTER (WHERE NOT r.windowed) AS max_step_ns,
       median(r.own_ns) FILTER (WHERE NOT r.windowed) AS median_own_ns,
       list({'iteration': r.iteration, 'step_ns': r.step_ns} ORDER BY r.step_ns DESC, r.iteration)
           FILTER (WHERE NOT r.windowed)[1:$worst] AS worst_iterations,
       any_value(s.score) AS score, any_value(s.iteration) AS score_iteration
FROM rows r LEFT JOIN watch_scores s ON s.recording_id = $id AND s.rank = r.rank
GROUP BY r.rank ORDER BY r.rank
"""

# The job's step of an iteration: the longest rank's (the ranks of a synchronous job wait for it).
JOB_SQL = """
SELECT count(*) AS num_iterations, median(step_ns) AS median_step_ns,
       quantile_cont(step_ns, 0.9) AS p90_step_ns, max(step_ns) AS max_step_ns
FROM (SELECT iteration, max(step_ns) AS step_ns FROM watch_steps WHERE recording_id = $id
      GROUP BY iteration HAVING NOT bool_or(windowed))
"""


def recording_of_run(con: duckdb.DuckDBPyConnection, run_id: int) -> int | None:
    """The watched recording a window run belongs to, or None."""
    row = con.execute("SELECT min(recording_id) FROM watch_windows WHERE run_id = ?", [run_id]).fetchone()
    return row[0]


def resolve(con: duckdb.DuckDBPyConnection, run: str | None) -> tuple[int | None, int | None]:
    """(run_id, recording_id) for `bprof analyze RUN` / `bprof export RUN`: a run (and its recording,
    if watched), or a recording's name (watch-<dir>) with no run; with no RUN, the latest run, else
    (a store holding only watch series) the latest recording."""
    from bprof.store.runs import resolve_run

    if run is not None and not con.execute("SELECT 1 FROM runs WHERE name = ?", [str(run)]).fetchone():
        row = con.execute("SELECT recording_id FROM watch_recordings WHERE name = ?", [str(run)]).fetchone()
        if row:
            return None, row[0]
    if run is None and con.execute("SELECT count(*) FROM runs").fetchone()[0] == 0:
        row = con.execute("SELECT max(recording_id) FROM watch_recordings").fetchone()
        if row[0] is not None:
            return None, row[0]
    try:
        run_id = resolve_run(con, run)
    except UsageError as exc:
        raise UsageError(f"{exc} (nor a watched recording: their names are watch-<run directory>)") from None
    return run_id, recording_of_run(con, run_id)


def view(con: duckdb.DuckDBPyConnection, recording_id: int) -> dict:
    """The between-windows view of one recording, as plain data (bprof analyze prints it, --json dumps it)."""
    def rows(sql: str, params) -> list[dict]:
        cur = con.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]

    recording = rows("""SELECT recording_id, name, source_path, record_id, num_ranks, num_iterations,
                               newest_complete_iteration FROM watch_recordings WHERE recording_id = ?""",
                     [recording_id])[0]
    ranks = rows(RANKS_SQL, {"id": recording_id, "worst": WORST_ITERATIONS})
    job = rows(JOB_SQL, {"id": recording_id})[0]
    episodes = rows("""SELECT rule, rank, first_iteration, last_iteration, worst_score, triggered
                       FROM watch_episodes WHERE recording_id = ? ORDER BY episode_index""", [recording_id])
    triggers = rows("""
        SELECT t.trigger_index, t.rule, t.rank, t.seen_at_iteration, t.start_iteration,
               t.start_iteration + t.num_steps AS end_iteration, t.reason, t.run_id, r.name AS run_name,
               (SELECT count(*) FROM metrics m WHERE m.run_id = t.run_id) > 0 AS analysed
        FROM watch_triggers t LEFT JOIN runs r USING (run_id)
        WHERE t.recording_id = ? ORDER BY t.trigger_index""", [recording_id])
    for t in triggers:
        t["findings"] = _top_findings(con, t["run_id"]) if t["run_id"] is not None else []
    windows = rows("""SELECT w.run_id, r.name AS run_name, w.window_range, w.start_iteration, w.end_iteration,
                             w.attempt, w.trigger_reason
                      FROM watch_windows w JOIN runs r USING (run_id)
                      WHERE w.recording_id = ? ORDER BY w.start_iteration, w.attempt""", [recording_id])
    return {"recording": recording, "job": job, "ranks": ranks, "episodes": episodes, "triggers": triggers,
            "windows": windows}


def _top_findings(con, run_id: int) -> list[dict]:
    out = []
    for analyzer, severity, lost_ns, title, evidence in con.execute("""
            SELECT analyzer, severity, lost_ns, title, evidence FROM findings WHERE run_id = ?
            ORDER BY lost_ns DESC NULLS LAST, severity, finding_id LIMIT ?""", [run_id, TOP_FINDINGS]).fetchall():
        advice = (json.loads(evidence) if evidence else {}).get("advice")
        out.append({"analyzer": analyzer, "severity": severity, "lost_ns": lost_ns, "title": title, "advice": advice})
    return out
