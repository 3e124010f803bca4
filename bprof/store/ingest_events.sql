-- Which step does each staged event belong to? Moves _stage and _batch_steps into the store
-- tables events and steps for run $run_id.
-- Algorithm: a CPU event belongs to the step whose [ts, ts + dur) holds its start (ASOF join on
-- the step start). A GPU event belongs to the step of the runtime call that launched it (same
-- correlation id), since kernels often run after their step's CPU range has ended; GPU events
-- with no launch found fall back to the time rule.
INSERT INTO steps
SELECT $run_id, rank, step, ts_ns, dur_ns FROM _batch_steps;

INSERT INTO events
WITH by_time AS (
    SELECT e.*,
           CASE WHEN e.ts_ns < s.ts_ns + s.dur_ns THEN s.step END AS time_step
    FROM _stage e
    ASOF LEFT JOIN _batch_steps s ON e.rank = s.rank AND e.ts_ns >= s.ts_ns
), launch_step AS (
    SELECT rank, correlation, min(time_step) AS step
    FROM by_time
    WHERE kind = 'cuda_runtime' AND correlation IS NOT NULL AND time_step IS NOT NULL
    GROUP BY ALL
)
SELECT $run_id, e.rank, e.kind, e.cat, e.name, e.pid, e.tid, e.device, e.stream, e.ts_ns,
       e.dur_ns, e.correlation, e.external_id,
       CASE WHEN e.device IS NOT NULL THEN coalesce(l.step, e.time_step) ELSE e.time_step END,
       e.args
FROM by_time e
LEFT JOIN launch_step l
       ON e.device IS NOT NULL AND l.rank = e.rank AND l.correlation = e.correlation;
