-- Which step does each event of the batch's ranks belong to, and where is each step on the device?
-- Reads events of run $run_id for the ranks in _batch_files; writes steps and fills events.step.
-- Steps are the ProfilerStep#N ranges on the CPU; a step seen on several threads (or split by
-- a profiler restart) spans from its first start to its last end.
-- Algorithm: a CPU event belongs to the step whose [ts, ts + dur) holds its start (ASOF join on
-- the step start). A GPU event belongs to the step of the runtime or driver call that launched
-- it (same correlation id; NCCL >= 2.27 and Triton launch through the driver API), since kernels
-- often run after their step's CPU range has ended; GPU events with no launch found fall back to
-- the time rule.
-- Algorithm (the step on the device, steps.device_*): a step's device work is the kernels, memcpys
-- and memsets it launched (events.step, as above). Its device step ends at the end of that work
-- (the latest end over this and earlier steps, so the device steps tile the device's timeline) and
-- starts where the previous step's device step ended, when step N-1 launched device work too: the
-- device was either still busy with it (the host ran ahead: a queue) or idle waiting for this
-- step's launches (host-bound: the wait is this step's). Otherwise (the first step) it starts where
-- the device was last busy before the step's first device work (work launched before the window),
-- but not before the step's CPU range began: a device idle since then was waiting for this step.
-- With no device activity recorded before it, what the device did before the window is unknown
-- (Kineto drops the warm-up steps' kernels), so the step's own launches say: when its first device
-- work started before the step's second launch, the device was free when the step first launched
-- (no queue) and the step starts at its CPU range (the device waited for it: data loading before
-- the first launch is the step's); else the device was busy with work the trace does not hold, and
-- the step starts at its first device work.
-- device_lag_ns = device end - CPU range end.
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

INSERT INTO steps (run_id, rank, step, ts_ns, dur_ns)
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

UPDATE steps t SET device_ts_ns = d.device_ts_ns, device_dur_ns = d.end_ns - d.device_ts_ns,
    device_lag_ns = d.end_ns - (t.ts_ns + t.dur_ns)
FROM (
    WITH work AS (
        SELECT rank, step, min(ts_ns) AS first_ns, max(ts_ns + dur_ns) AS last_end_ns
        FROM events
        WHERE run_id = $run_id AND rank IN (SELECT rank FROM _batch_files)
          AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND step IS NOT NULL
        GROUP BY ALL
    ), launches AS (
        -- the second launch (runtime or driver call) of each step that started device work
        SELECT l.rank, l.step, list(l.ts_ns ORDER BY l.ts_ns)[2] AS second_launch_ns
        FROM events l
        WHERE l.run_id = $run_id AND l.rank IN (SELECT rank FROM _batch_files)
          AND l.kind IN ('cuda_runtime', 'cuda_driver') AND l.step IS NOT NULL AND l.correlation IS NOT NULL
          AND EXISTS (SELECT 1 FROM events d WHERE d.run_id = $run_id AND d.rank = l.rank AND d.correlation = l.correlation
                      AND d.kind IN ('kernel', 'gpu_memcpy', 'gpu_memset'))
        GROUP BY ALL
    ), ends AS (
        SELECT w.rank, w.step, w.first_ns, s.ts_ns AS cpu_ts_ns,
            max(w.last_end_ns) OVER (PARTITION BY w.rank ORDER BY w.step ROWS UNBOUNDED PRECEDING) AS end_ns
        FROM work w JOIN _batch_steps s USING (rank, step)
    ), busy_before AS (
        -- where the device was last busy before the first device work of a step that no step N-1 precedes
        SELECT e.rank, e.step, max(v.ts_ns + v.dur_ns) AS busy_end_ns
        FROM ends e JOIN events v ON v.run_id = $run_id AND v.rank = e.rank AND v.ts_ns < e.first_ns
        WHERE v.kind IN ('kernel', 'gpu_memcpy', 'gpu_memset')
          AND NOT EXISTS (SELECT 1 FROM ends p WHERE p.rank = e.rank AND p.step = e.step - 1)
        GROUP BY ALL
    )
    SELECT e.rank, e.step, e.end_ns,
        coalesce(p.end_ns, least(e.first_ns, greatest(e.cpu_ts_ns, coalesce(
            b.busy_end_ns, CASE WHEN e.first_ns <= coalesce(n.second_launch_ns, e.first_ns) THEN e.cpu_ts_ns
                                ELSE e.first_ns END)))) AS device_ts_ns
    FROM ends e LEFT JOIN ends p ON p.rank = e.rank AND p.step = e.step - 1
    LEFT JOIN busy_before b ON b.rank = e.rank AND b.step = e.step
    LEFT JOIN launches n ON n.rank = e.rank AND n.step = e.step
) d
WHERE t.run_id = $run_id AND t.rank = d.rank AND t.step = d.step;
