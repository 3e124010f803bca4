-- Collective storms: many small collectives of one group and op issued back to back in every step
-- (metrics all-reduced one scalar at a time, per-parameter broadcasts). Each costs a whole latency
-- (and, synchronous, a host round trip) however few bytes it moves: batched into one call, all but
-- one latency go. Reads collectives, events; writes storms_groups. Priced by storms.py with the what-if
-- scenario coalesce-small, whose batches follow the same rule on the step graph.
--
-- Definitions: a small call is a collective (not p2p, not a barrier) of at most $max_bytes bytes
-- (the larger of its input and output). On each rank, in call order, a small call continues the
-- previous call's batch when that call is small too, of the same group (pg_name, else pg_ranks) and
-- op, and the work between them is at most the previous call's duration (the calls dominate: a
-- tensor-parallel all-reduce after each layer has the layer between, and is no batch). The work
-- between: on a rank with kernels, the time from the previous call's end to this call's start,
-- with no kernel starting in between; on a rank without (a CPU trace), the CPU ops on the calling
-- thread between the previous call's CPU end and this call's CPU start (outermost ops ending
-- there, summed): Python between the calls is no work, and counting it would break a storm
-- wherever the interpreter's overhead is about one small call (on 2 gloo ranks: 20-350 us between
-- two scalar all-reduces of 100-700 us, 12-40 us of it ops). Call times are the device (or gloo
-- worker) range, else the CPU call's.
-- A storm is a group and op whose median over (rank, step) of calls in batches of two or more is at
-- least $min_calls.

CREATE TABLE IF NOT EXISTS storms_groups (
    run_id INTEGER NOT NULL,
    pg_name VARCHAR,
    pg_desc VARCHAR,
    pg_ranks INTEGER[],
    op VARCHAR NOT NULL,
    num_steps INTEGER NOT NULL,
    calls_per_step DOUBLE NOT NULL,
    median_bytes BIGINT,
    comm_ns_per_step BIGINT,
    ranks INTEGER[]
);
COMMENT ON TABLE storms_groups IS 'One row per process group and op with a storm of small collectives in its steps (definitions in storms.sql).';
COMMENT ON COLUMN storms_groups.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN storms_groups.pg_name IS 'Process group name (collectives.pg_name).';
COMMENT ON COLUMN storms_groups.pg_desc IS 'Process group description (collectives.pg_desc).';
COMMENT ON COLUMN storms_groups.pg_ranks IS 'Global ranks of the group, when traced.';
COMMENT ON COLUMN storms_groups.op IS 'Canonical op of the small collectives.';
COMMENT ON COLUMN storms_groups.num_steps IS 'Steps with a batch of this group and op on some rank.';
COMMENT ON COLUMN storms_groups.calls_per_step IS 'Median over (rank, step) with a batch of the number of calls in batches.';
COMMENT ON COLUMN storms_groups.median_bytes IS 'Median over (rank, step) of the median size of those calls (bytes: the larger of input and output).';
COMMENT ON COLUMN storms_groups.comm_ns_per_step IS 'Median over (rank, step) of the summed duration of those calls (device or gloo worker range, else the CPU call; ns).';
COMMENT ON COLUMN storms_groups.ranks IS 'Ranks with a batch of this group and op.';

INSERT INTO storms_groups
WITH calls AS (
    SELECT rank, step, call_index, op, pg_name, pg_desc, pg_ranks,
        coalesce(pg_name, CAST(pg_ranks AS VARCHAR)) AS grp,
        greatest(coalesce(in_bytes, 0), coalesce(out_bytes, 0)) AS size_bytes,
        (in_bytes IS NOT NULL OR out_bytes IS NOT NULL) AND greatest(coalesce(in_bytes, 0), coalesce(out_bytes, 0)) <= $max_bytes
            AND NOT is_p2p AND op <> 'barrier' AS small,
        coalesce(device_ts_ns, cpu_ts_ns) AS ts_ns,
        coalesce(device_ts_ns + device_dur_ns, cpu_ts_ns + cpu_dur_ns) AS end_ns
    FROM collectives WHERE run_id = $run_id AND step IS NOT NULL
), cpu_ranks AS (
    SELECT DISTINCT rank FROM calls WHERE small
      AND rank NOT IN (SELECT DISTINCT rank FROM events WHERE run_id = $run_id AND kind = 'kernel')
), cpu_ops AS (
    SELECT rank, tid, ts_ns, dur_ns,
        max(ts_ns + dur_ns) OVER (PARTITION BY rank, tid ORDER BY ts_ns, dur_ns DESC
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS earlier_end_ns
    FROM events WHERE run_id = $run_id AND kind = 'cpu_op' AND rank IN (SELECT rank FROM cpu_ranks)
), op_marks AS (
    -- CPU work between two calls on a rank without kernels: the outermost ops' time so far, by a
    -- running sum over their ends and the calls' CPU starts and ends
    SELECT rank, tid, ts_ns + dur_ns AS t, 0 AS kind, dur_ns, NULL::INTEGER AS call_index FROM cpu_ops
    WHERE earlier_end_ns IS NULL OR earlier_end_ns <= ts_ns
    UNION ALL SELECT c.rank, c.tid, c.cpu_ts_ns, 1, 0, c.call_index
    FROM collectives c JOIN cpu_ranks USING (rank) WHERE c.run_id = $run_id AND c.step IS NOT NULL AND c.cpu_ts_ns IS NOT NULL
    UNION ALL SELECT c.rank, c.tid, c.cpu_ts_ns + c.cpu_dur_ns, 2, 0, c.call_index
    FROM collectives c JOIN cpu_ranks USING (rank) WHERE c.run_id = $run_id AND c.step IS NOT NULL AND c.cpu_ts_ns IS NOT NULL
), op_counted AS (
    SELECT *, sum(dur_ns) OVER (PARTITION BY rank, tid ORDER BY t, kind ROWS UNBOUNDED PRECEDING) AS ops_ns_so_far
    FROM op_marks
), at_call_ops AS (
    SELECT rank, call_index, max(ops_ns_so_far) FILTER (WHERE kind = 1) AS ops_at_start,
        max(ops_ns_so_far) FILTER (WHERE kind = 2) AS ops_at_end
    FROM op_counted WHERE kind > 0 GROUP BY rank, call_index
), marks AS (
    -- device work between two calls: kernels (of no call: consecutive calls have none of their own
    -- between them) counted by a running sum over the rank's kernel starts and call marks
    SELECT rank, ts_ns AS t, 0 AS kind, NULL::INTEGER AS call_index FROM events
    WHERE run_id = $run_id AND kind = 'kernel' AND rank IN (SELECT rank FROM calls WHERE small)
    UNION ALL SELECT rank, ts_ns, 1, call_index FROM calls WHERE small
    UNION ALL SELECT rank, end_ns, 2, call_index FROM calls WHERE small
), counted AS (
    SELECT *, sum(CASE WHEN kind = 0 THEN 1 ELSE 0 END) OVER (PARTITION BY rank ORDER BY t, kind
                                                             ROWS UNBOUNDED PRECEDING) AS kernels_so_far
    FROM marks
), at_call AS (
    SELECT rank, call_index, max(kernels_so_far) FILTER (WHERE kind = 1) AS at_start,
        max(kernels_so_far) FILTER (WHERE kind = 2) AS at_end
    FROM counted WHERE kind > 0 GROUP BY rank, call_index
), linked AS (
    SELECT c.*,
        c.small AND lag(c.small) OVER w AND c.grp IS NOT DISTINCT FROM lag(c.grp) OVER w AND c.op = lag(c.op) OVER w
            AND CASE WHEN o.ops_at_start IS NOT NULL THEN o.ops_at_start - lag(o.ops_at_end) OVER w
                     ELSE c.ts_ns - lag(c.end_ns) OVER w END <= lag(c.end_ns) OVER w - lag(c.ts_ns) OVER w
            AND coalesce(a.at_start - lag(a.at_end) OVER w, 0) = 0 AS continues
    FROM calls c LEFT JOIN at_call a USING (rank, call_index) LEFT JOIN at_call_ops o USING (rank, call_index)
    WINDOW w AS (PARTITION BY c.rank ORDER BY c.call_index)
), batched AS (
    -- a call is in a batch when it continues the previous one or the next one continues it
    SELECT *, coalesce(continues, false) OR coalesce(lead(continues) OVER (PARTITION BY rank ORDER BY call_index), false) AS in_batch
    FROM linked
), per_rank_step AS (
    SELECT grp, op, rank, step, min(pg_name) AS pg_name, min(pg_desc) AS pg_desc, min(pg_ranks) AS pg_ranks,
        count(*) AS calls, median(size_bytes) AS size_bytes, sum(greatest(end_ns - ts_ns, 0)) AS comm_ns
    FROM batched WHERE small AND in_batch GROUP BY grp, op, rank, step
)
SELECT $run_id, min(pg_name), min(pg_desc), min(pg_ranks), op, count(DISTINCT step),
    median(calls), CAST(median(size_bytes) AS BIGINT), CAST(median(comm_ns) AS BIGINT),
    list(DISTINCT rank ORDER BY rank)
FROM per_rank_step
GROUP BY grp, op
HAVING median(calls) >= $min_calls;
