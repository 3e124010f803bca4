-- Which calls of different ranks are one collective or p2p instance, and which instances do not
-- match (a member missing, a different op, size or dtype)? The first step towards a hang diagnosis,
-- and the input of clock alignment and collective performance.
-- Reads collectives, steps, ranks; writes match_instances, match_members.
--
-- Definitions:
-- * Group identity: (pg_name, pg_ranks). Ranks alone would merge two process groups over the same
--   ranks (Megatron's DP group and DP-with-CP group at cp=1, a gloo twin of an NCCL group): each
--   counts its own sequence numbers, so their calls would collide. pg_name is the same on every rank
--   (torch names groups by a global creation counter).
-- * A collective instance is (group, seq); a p2p instance is (group, sender, receiver, seq). The
--   peer of a send/recv is collectives.peer_rank, else the other rank of a two-rank group.
--   Without seq, the k-th call of the group (of the pair, for p2p) in a step on each rank.
-- * A member's arrival is the start of its device work (first NCCL kernel, gloo worker range),
--   else of its CPU call; its end is the end of that device work (NULL without device work: the
--   end of an asynchronous CPU call is when it was enqueued, not when it finished).
-- * Expected members: the group's ranks (the ranks seen calling on the group when pg_ranks is
--   unknown); for p2p, the sender and the receiver.

CREATE TABLE IF NOT EXISTS match_instances (
    run_id INTEGER NOT NULL,
    instance_id BIGINT NOT NULL,
    op VARCHAR NOT NULL,
    pg_name VARCHAR,
    pg_desc VARCHAR,
    pg_ranks INTEGER[],
    group_size INTEGER,
    seq BIGINT,
    src_rank INTEGER,
    dst_rank INTEGER,
    step INTEGER,
    is_p2p BOOLEAN NOT NULL,
    num_members INTEGER NOT NULL,
    num_expected INTEGER,
    missing_ranks INTEGER[],
    cut_ranks INTEGER[],
    status VARCHAR NOT NULL,
    reason VARCHAR,
    dtype VARCHAR,
    bytes BIGINT,
    timing VARCHAR NOT NULL,
    PRIMARY KEY (run_id, instance_id)
);
COMMENT ON TABLE match_instances IS 'One row per collective or p2p instance: the calls of its members matched by group and sequence number.';
COMMENT ON COLUMN match_instances.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN match_instances.instance_id IS 'Instance number within the run (ordered by step, group, sender, receiver, seq).';
COMMENT ON COLUMN match_instances.op IS 'Canonical op of the collective (collectives.op), p2p for a send/recv pair, or the first member''s op when members disagree.';
COMMENT ON COLUMN match_instances.pg_name IS 'Process group name.';
COMMENT ON COLUMN match_instances.pg_desc IS 'Process group description (of the first member that traced one).';
COMMENT ON COLUMN match_instances.pg_ranks IS 'Global ranks of the process group, when traced.';
COMMENT ON COLUMN match_instances.group_size IS 'Number of ranks in the process group.';
COMMENT ON COLUMN match_instances.seq IS 'Sequence number the members share (per group; per sender-receiver pair for bprof record p2p); NULL when matched by order within the step.';
COMMENT ON COLUMN match_instances.src_rank IS 'p2p: the sending rank; NULL for collectives.';
COMMENT ON COLUMN match_instances.dst_rank IS 'p2p: the receiving rank; NULL for collectives.';
COMMENT ON COLUMN match_instances.step IS 'Profiler step of the members (the earliest when they differ); NULL when no member call lies in a step.';
COMMENT ON COLUMN match_instances.is_p2p IS 'True for a send/recv pair.';
COMMENT ON COLUMN match_instances.num_members IS 'Calls matched into the instance (one per rank when it is complete).';
COMMENT ON COLUMN match_instances.num_expected IS 'Ranks expected: the group''s ranks, or sender and receiver for p2p.';
COMMENT ON COLUMN match_instances.missing_ranks IS 'Expected ranks with no matching call although the instance lies within the steps they traced (a mismatch); empty when none.';
COMMENT ON COLUMN match_instances.cut_ranks IS 'Expected ranks with no matching call because the instance lies outside what they traced (outside their steps, or no trace): the instance is cut by the window; empty when none.';
COMMENT ON COLUMN match_instances.status IS 'complete (every expected rank, once, same op, size and dtype); cut (members missing only because the call lies outside the steps a missing rank traced, or that rank has no trace: left out of everything downstream); mismatch (a member missing within the steps every member traced, or members differing in op, size or dtype, or a rank calling twice); unknown (a send or recv whose peer is not known).';
COMMENT ON COLUMN match_instances.reason IS 'Why the instance is not complete, in words; NULL when complete.';
COMMENT ON COLUMN match_instances.dtype IS 'Element type as traced (of the first member that traced one).';
COMMENT ON COLUMN match_instances.bytes IS 'Message size as nccl-tests counts it: all_gather and gather its output, reduce_scatter and scatter its input, all_reduce, broadcast, reduce and p2p the message, all_to_all the mean bytes a member sends; NULL when not traced (barrier: 0).';
COMMENT ON COLUMN match_instances.timing IS 'device when every member has device (or gloo worker) timing, else cpu (some arrivals are CPU call starts, and ends are unknown).';

CREATE TABLE IF NOT EXISTS match_members (
    run_id INTEGER NOT NULL,
    instance_id BIGINT NOT NULL,
    rank INTEGER NOT NULL,
    call_index INTEGER NOT NULL,
    step INTEGER,
    arrival_ts_ns BIGINT,
    end_ts_ns BIGINT,
    arrival_aligned_ns BIGINT,
    end_aligned_ns BIGINT,
    PRIMARY KEY (run_id, rank, call_index)
);
COMMENT ON TABLE match_members IS 'One row per call matched into an instance (collectives row of a member).';
COMMENT ON COLUMN match_members.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN match_members.instance_id IS 'Instance (match_instances.instance_id).';
COMMENT ON COLUMN match_members.rank IS 'Global rank of the member.';
COMMENT ON COLUMN match_members.call_index IS 'The call (collectives.call_index on that rank).';
COMMENT ON COLUMN match_members.step IS 'Profiler step of the call on this rank.';
COMMENT ON COLUMN match_members.arrival_ts_ns IS 'When the member joined: start of its device work (first NCCL kernel, gloo worker range), else of its CPU call; own clock.';
COMMENT ON COLUMN match_members.end_ts_ns IS 'End of its device work (last NCCL kernel or gloo range); own clock; NULL without device work.';
COMMENT ON COLUMN match_members.arrival_aligned_ns IS 'arrival_ts_ns + the rank''s clock offset (ranks.clock_offset_ns): on the reference clock; filled by the clock analyzer, NULL while the offset is unknown.';
COMMENT ON COLUMN match_members.end_aligned_ns IS 'end_ts_ns + the rank''s clock offset; filled by the clock analyzer.';

-- Every call with its group identity, match key and expected members.
CREATE OR REPLACE TEMP TABLE _match_calls AS
WITH groups AS (
    SELECT pg_name, pg_ranks, row_number() OVER (ORDER BY pg_name, pg_ranks) AS gid
    FROM (SELECT DISTINCT pg_name, pg_ranks FROM collectives
          WHERE run_id = $run_id AND (pg_name IS NOT NULL OR pg_ranks IS NOT NULL))
), calls AS (
    SELECT c.rank, c.call_index, c.op, c.is_p2p, c.pg_name, c.pg_desc, c.pg_ranks, c.group_size, c.seq,
        c.dtype, c.step, c.in_elems, c.out_elems, c.in_bytes, c.out_bytes, g.gid,
        CASE WHEN c.is_p2p THEN coalesce(c.peer_rank,
            CASE WHEN len(c.pg_ranks) = 2 AND list_contains(c.pg_ranks, c.rank)
                 THEN list_filter(c.pg_ranks, lambda r: r <> c.rank)[1] END) END AS peer,
        coalesce(c.device_ts_ns, c.cpu_ts_ns) AS arrival_ts_ns,
        c.device_ts_ns + c.device_dur_ns AS end_ts_ns,
        c.device_ts_ns IS NOT NULL AS on_device
    FROM collectives c
    JOIN groups g ON g.pg_name IS NOT DISTINCT FROM c.pg_name AND g.pg_ranks IS NOT DISTINCT FROM c.pg_ranks
    WHERE c.run_id = $run_id
), keyed AS (
    SELECT *,
        CASE WHEN NOT is_p2p THEN NULL WHEN op = 'send' THEN rank ELSE peer END AS src_rank,
        CASE WHEN NOT is_p2p THEN NULL WHEN op = 'send' THEN peer ELSE rank END AS dst_rank,
        CASE WHEN seq IS NULL THEN step END AS key_step,
        -- the size every member must agree on (NULL: not compared)
        CASE WHEN op IN ('all_reduce', 'broadcast', 'reduce', 'all_gather', 'gather', 'send', 'recv') THEN in_elems
             WHEN op IN ('reduce_scatter', 'scatter') THEN coalesce(out_elems, in_elems) END AS cmp_elems,
        CASE lower(regexp_replace(dtype, '^c10::', ''))
            WHEN 'float32' THEN 'float' WHEN 'f32' THEN 'float' WHEN 'float16' THEN 'half' WHEN 'f16' THEN 'half'
            WHEN 'bf16' THEN 'bfloat16' WHEN 'float64' THEN 'double' WHEN 'f64' THEN 'double'
            WHEN 'int64' THEN 'long' WHEN 'i64' THEN 'long' WHEN 'int32' THEN 'int' WHEN 'i32' THEN 'int'
            WHEN 'uint8' THEN 'byte' WHEN 'u8' THEN 'byte' WHEN 'int8' THEN 'char' WHEN 'i8' THEN 'char'
            ELSE lower(regexp_replace(dtype, '^c10::', '')) END AS cmp_dtype
    FROM calls
)
SELECT *, NULL::BIGINT AS ordinal FROM keyed WHERE seq IS NOT NULL
UNION ALL
-- without seq: the k-th call of the group (of the pair) in the step
SELECT *, row_number() OVER (PARTITION BY rank, gid, src_rank, dst_rank, step ORDER BY call_index) AS ordinal
FROM keyed WHERE seq IS NULL;

-- Algorithm: one GROUP BY over the match key gives each instance its members and whether they
-- agree; instance ids follow (step, group, sender, receiver, seq).
CREATE OR REPLACE TEMP TABLE _match_inst AS
WITH seen AS (
    -- ranks calling on each group: the expected members when pg_ranks is unknown
    SELECT gid, list(DISTINCT rank ORDER BY rank) AS ranks FROM _match_calls GROUP BY gid
), agg AS (
    SELECT gid, is_p2p, src_rank, dst_rank, seq, key_step, ordinal,
        count(*) AS num_members, count(DISTINCT rank) AS num_ranks,
        list(DISTINCT rank ORDER BY rank) AS present,
        min(step) AS step, max(step) AS max_step, bool_or(step IS NULL) AS any_null_step,
        first(op ORDER BY rank, call_index) AS first_op, count(DISTINCT op) AS num_ops,
        list(DISTINCT op ORDER BY op) AS ops,
        count(DISTINCT cmp_dtype) AS num_dtypes, list(DISTINCT dtype ORDER BY dtype) FILTER (WHERE dtype IS NOT NULL) AS dtypes,
        count(DISTINCT cmp_elems) AS num_sizes, list(DISTINCT cmp_elems ORDER BY cmp_elems) FILTER (WHERE cmp_elems IS NOT NULL) AS sizes,
        first(pg_name) AS pg_name, first(pg_desc ORDER BY pg_desc IS NULL, rank) AS pg_desc,
        first(pg_ranks) AS pg_ranks, max(group_size) AS group_size,
        first(dtype ORDER BY dtype IS NULL, rank) AS dtype,
        max(in_bytes) AS in_bytes, max(out_bytes) AS out_bytes, avg(in_bytes) AS mean_in_bytes,
        bool_and(on_device) AS on_device
    FROM _match_calls
    GROUP BY gid, is_p2p, src_rank, dst_rank, seq, key_step, ordinal
), expected AS (
    SELECT a.*,
        CASE WHEN a.is_p2p THEN CASE WHEN a.src_rank IS NOT NULL AND a.dst_rank IS NOT NULL
                                     THEN list_distinct([a.src_rank, a.dst_rank]) END
             ELSE coalesce(list_sort(a.pg_ranks), s.ranks) END AS expected
    FROM agg a JOIN seen s USING (gid)
)
SELECT row_number() OVER (ORDER BY step NULLS FIRST, gid, src_rank, dst_rank, seq, key_step, ordinal) AS instance_id,
    *,
    coalesce(list_filter(expected, lambda r: NOT list_contains(present, r)), []) AS missing,
    coalesce(list_filter(present, lambda r: NOT list_contains(expected, r)), []) AS extra
FROM expected;

-- Algorithm: a missing member is excused (the instance is cut, not mismatched) when its rank has
-- no trace, or its traced steps do not cover the instance's steps (ranks whose windows cover
-- different steps are intersected), or, for a rank without ProfilerStep ranges, when the seq lies
-- outside the seqs it traced on that group (pair): then the call fell outside its window.
CREATE OR REPLACE TEMP TABLE _match_missing AS
WITH windows AS (
    SELECT r.rank, min(s.step) AS first_step, max(s.step) AS last_step
    FROM ranks r LEFT JOIN steps s ON s.run_id = r.run_id AND s.rank = r.rank
    WHERE r.run_id = $run_id GROUP BY r.rank
), seqs AS (
    SELECT rank, gid, src_rank, dst_rank, min(seq) AS min_seq, max(seq) AS max_seq
    FROM _match_calls GROUP BY ALL
), m AS (
    SELECT i.instance_id, i.gid, i.src_rank, i.dst_rank, i.seq, i.step, i.max_step, i.any_null_step,
        unnest(i.missing) AS rank
    FROM _match_inst i WHERE len(i.missing) > 0
)
SELECT m.instance_id, m.rank,
    CASE WHEN w.rank IS NULL THEN 'no trace'
         WHEN w.first_step IS NOT NULL AND (m.any_null_step OR m.step < w.first_step OR m.max_step > w.last_step)
             THEN 'outside its traced steps'
         WHEN w.first_step IS NULL AND (m.seq IS NULL OR q.rank IS NULL OR m.seq < q.min_seq OR m.seq > q.max_seq)
             THEN 'outside its traced calls'
    END AS excuse
FROM m
LEFT JOIN windows w ON w.rank = m.rank
LEFT JOIN seqs q ON q.rank = m.rank AND q.gid = m.gid
     AND q.src_rank IS NOT DISTINCT FROM m.src_rank AND q.dst_rank IS NOT DISTINCT FROM m.dst_rank;

INSERT INTO match_instances
WITH missing AS (
    SELECT instance_id,
        list(rank ORDER BY rank) FILTER (WHERE excuse IS NULL) AS missing_in_window,
        list(rank ORDER BY rank) FILTER (WHERE excuse IS NOT NULL) AS cut,
        string_agg(format('rank {} {}', rank, excuse), ', ' ORDER BY rank) FILTER (WHERE excuse IS NOT NULL) AS excused
    FROM _match_missing GROUP BY instance_id
), judged AS (
    SELECT i.*, coalesce(m.missing_in_window, []) AS missing_in_window, coalesce(m.cut, []) AS cut, m.excused
    FROM _match_inst i LEFT JOIN missing m USING (instance_id)
), problems AS (
    SELECT *,
        concat_ws('; ',
            CASE WHEN is_p2p AND (src_rank IS NULL OR dst_rank IS NULL) THEN 'peer of the send/recv unknown' END,
            CASE WHEN len(missing_in_window) > 0
                 THEN format('ranks {} missing within the steps every member traced', missing_in_window) END,
            CASE WHEN num_members > num_ranks THEN 'a rank called twice' END,
            CASE WHEN len(extra) > 0 THEN format('ranks {} are not in the group', extra) END,
            CASE WHEN num_ops > 1 AND NOT is_p2p THEN format('different ops {}', ops) END,
            CASE WHEN num_sizes > 1 THEN format('different sizes {} elements', sizes) END,
            CASE WHEN num_dtypes > 1 THEN format('different dtypes {}', dtypes) END,
            CASE WHEN excused IS NOT NULL THEN format('cut by the trace window: {}', excused) END) AS why,
        is_p2p AND (src_rank IS NULL OR dst_rank IS NULL) AS peer_unknown,
        len(missing_in_window) > 0 OR num_members > num_ranks OR len(extra) > 0 OR (num_ops > 1 AND NOT is_p2p)
            OR num_sizes > 1 OR num_dtypes > 1 AS mismatched
    FROM judged
)
SELECT $run_id, instance_id,
    CASE WHEN is_p2p THEN 'p2p' ELSE first_op END,
    pg_name, pg_desc, pg_ranks, group_size, seq, src_rank, dst_rank, step, is_p2p,
    num_members, len(expected), missing_in_window, cut,
    CASE WHEN peer_unknown THEN 'unknown' WHEN mismatched THEN 'mismatch'
         WHEN len(missing) > 0 THEN 'cut' ELSE 'complete' END,
    nullif(why, ''), dtype,
    CAST(CASE WHEN is_p2p THEN in_bytes
         ELSE CASE first_op
             WHEN 'all_gather' THEN coalesce(out_bytes, in_bytes * len(expected))
             WHEN 'gather' THEN coalesce(out_bytes, in_bytes * len(expected))
             WHEN 'reduce_scatter' THEN coalesce(in_bytes, out_bytes * len(expected))
             WHEN 'scatter' THEN coalesce(in_bytes, out_bytes * len(expected))
             WHEN 'all_to_all' THEN round(mean_in_bytes)
             WHEN 'barrier' THEN 0
             ELSE coalesce(in_bytes, out_bytes) END END AS BIGINT),
    CASE WHEN on_device THEN 'device' ELSE 'cpu' END
FROM problems;

INSERT INTO match_members
SELECT $run_id, i.instance_id, c.rank, c.call_index, c.step, c.arrival_ts_ns, c.end_ts_ns, NULL, NULL
FROM _match_calls c
JOIN _match_inst i ON i.gid = c.gid AND i.is_p2p = c.is_p2p
     AND i.src_rank IS NOT DISTINCT FROM c.src_rank AND i.dst_rank IS NOT DISTINCT FROM c.dst_rank
     AND i.seq IS NOT DISTINCT FROM c.seq AND i.ordinal IS NOT DISTINCT FROM c.ordinal
     AND i.key_step IS NOT DISTINCT FROM c.key_step;
