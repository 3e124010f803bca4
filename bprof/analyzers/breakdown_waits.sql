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

-- The overlap of the waits' union with the exposed segments: an equi-join on (rank, step, 1 ms
-- time bucket), overlaps clipped to the bucket (as breakdown_dims in breakdown.sql).
UPDATE breakdown_steps b SET
    exposed_wait_ns = w.wait_ns,
    exposed_transfer_ns = b.exposed_comm_ns - w.wait_ns
FROM (
    WITH ub AS (
        SELECT key.rank AS rank, key.step AS step, ts_ns, end_ns,
            unnest(range(ts_ns // 1000000, (end_ns - 1) // 1000000 + 1)) AS bucket FROM _bd_wait_union
    ), xb AS (
        SELECT rank, step, ts_ns, end_ns, unnest(range(ts_ns // 1000000, (end_ns - 1) // 1000000 + 1)) AS bucket
        FROM _bd_seg WHERE label = 'exposed_comm' AND end_ns > ts_ns
    ), overlap AS (
        SELECT ub.rank, ub.step, least(ub.end_ns, xb.end_ns, (ub.bucket + 1) * 1000000)
                                 - greatest(ub.ts_ns, xb.ts_ns, ub.bucket * 1000000) AS overlap_ns
        FROM ub JOIN xb ON xb.rank = ub.rank AND xb.step = ub.step AND xb.bucket = ub.bucket
         AND xb.ts_ns < ub.end_ns AND xb.end_ns > ub.ts_ns
    )
    SELECT s.rank, s.step, CAST(coalesce(sum(o.overlap_ns) FILTER (WHERE o.overlap_ns > 0), 0) AS BIGINT) AS wait_ns
    FROM (SELECT rank, step FROM breakdown_steps WHERE run_id = $run_id) s
    LEFT JOIN overlap o USING (rank, step)
    GROUP BY s.rank, s.step
) w
WHERE b.run_id = $run_id AND b.rank = w.rank AND b.step = w.step;
