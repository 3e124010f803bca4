-- Which step does each event of the batch's ranks belong to? Reads events of run $run_id for
-- the ranks in _batch_files; writes steps and fills events.step.
-- Steps are the ProfilerStep#N ranges on the CPU; a step seen on several threads (or split by
-- a profiler restart) spans from its first start to its last end.
-- Algorithm: a CPU event belongs to the step whose [ts, ts + dur) holds its start (ASOF join on
-- the step start). A GPU event belongs to the step of the runtime or driver call that launched
-- it (same correlation id; NCCL >= 2.27 and Triton launch through the driver API), since kernels
-- often run after their step's CPU range has ended; GPU events with no launch found fall back to
-- the time rule.
CREATE OR REPLACE TEMP TABLE _batch_steps AS
SELECT rank,
       CAST(substr(name, 14) AS INTEGER) AS step,
       min(ts_ns) AS ts_ns,
       max(ts_ns + dur_ns) - min(ts_ns) AS dur_ns
FROM events
WHERE run_id = $run_id AND rank IN (SELECT rank FROM _batch_files)
  AND kind IN ('user_annotation', 'cpu_op') AND name LIKE 'ProfilerStep#%'
  AND TRY_CAST(substr(name, 14) AS INTEGER) IS NOT NULL
GROUP BY ALL;

INSERT INTO steps
SELECT $run_id, rank, step, ts_ns, dur_ns FROM _batch_steps;

UPDATE events e SET step = s.step
FROM (
    SELECT e.rowid AS row_id, s.step
    FROM events e
    ASOF JOIN _batch_steps s ON e.rank = s.rank AND e.ts_ns >= s.ts_ns
    WHERE e.run_id = $run_id AND e.rank IN (SELECT rank FROM _batch_files)
      AND e.kind NOT IN ('metadata') AND e.ts_ns < s.ts_ns + s.dur_ns
) s
WHERE e.rowid = s.row_id;

UPDATE events e SET step = l.step
FROM (
    SELECT rank, correlation, min(step) AS step
    FROM events
    WHERE run_id = $run_id AND rank IN (SELECT rank FROM _batch_files)
      AND kind IN ('cuda_runtime', 'cuda_driver') AND correlation IS NOT NULL AND step IS NOT NULL
    GROUP BY ALL
) l
WHERE e.run_id = $run_id AND e.device IS NOT NULL AND e.rank = l.rank AND e.correlation = l.correlation;
