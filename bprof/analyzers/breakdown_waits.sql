-- How much of each step's exposed communication was waiting for the last peer to arrive? Splits
-- breakdown_steps.exposed_comm_ns into exposed_wait_ns and exposed_transfer_ns once cross-rank
-- analysis has matched collectives and aligned clocks (collperf_waits: each member's wait as an
-- interval on its own clock). Runs only when collperf_waits holds rows for the run.
-- Algorithm: the union of a rank's wait intervals (concurrent collectives can wait at once),
-- intersected with its exposed_comm segments of the partition; the rest of the exposed time is
-- transfer (or communication the matching could not see: cut or unmatched calls).

CREATE OR REPLACE TEMP TABLE _bd_wait_iv AS
SELECT {'rank': w.rank, 'step': s.step} AS key, 0 AS cls,
    greatest(w.ts_ns, s.ts_ns) AS ts_ns, least(w.end_ns, s.ts_ns + s.dur_ns) AS end_ns
FROM collperf_waits w JOIN timeline_spans s ON s.run_id = w.run_id AND s.rank = w.rank
     AND w.ts_ns < s.ts_ns + s.dur_ns AND w.end_ns > s.ts_ns
WHERE w.run_id = $run_id;

CREATE OR REPLACE TEMP TABLE _bd_wait_union AS SELECT * FROM iv_union('_bd_wait_iv');

UPDATE breakdown_steps b SET
    exposed_wait_ns = w.wait_ns,
    exposed_transfer_ns = b.exposed_comm_ns - w.wait_ns
FROM (
    SELECT s.rank, s.step, CAST(coalesce(sum(least(u.end_ns, x.end_ns) - greatest(u.ts_ns, x.ts_ns)), 0) AS BIGINT) AS wait_ns
    FROM (SELECT rank, step FROM breakdown_steps WHERE run_id = $run_id) s
    LEFT JOIN _bd_wait_union u ON u.key.rank = s.rank AND u.key.step = s.step
    LEFT JOIN _bd_seg x ON x.rank = s.rank AND x.step = s.step AND x.label = 'exposed_comm'
         AND x.ts_ns < u.end_ns AND x.end_ns > u.ts_ns
    GROUP BY s.rank, s.step
) w
WHERE b.run_id = $run_id AND b.rank = w.rank AND b.step = w.step;
