-- Which process group and per-group sequence number does each collective call of run $run_id
-- have where its trace does not say (gloo traces carry neither)? Reads _flight_recorder (the
-- Flight Recorder entries `bprof record` saved per rank and window) and ranks.distributed_info;
-- updates collectives.
-- Algorithm: a Flight Recorder entry is created inside its c10d call, so it belongs to the
-- latest call of the same op on its rank that started at or before the entry's creation time
-- (ASOF join) and had not ended by then. Both times come from the same process clock.
-- The members of every process group each rank knew (its trace's distributedInfo.pg_config).
CREATE OR REPLACE TEMP TABLE _pg_members AS
SELECT rank, pg ->> '$.pg_name' AS pg_name, TRY_CAST(pg -> '$.ranks' AS INTEGER[]) AS ranks
FROM (SELECT rank, unnest(TRY_CAST(distributed_info -> '$.pg_config' AS JSON[])) AS pg
      FROM ranks WHERE run_id = $run_id);

UPDATE collectives c
SET pg_name = m.pg_name,
    pg_desc = m.pg_desc,
    seq = m.seq,
    pg_ranks = coalesce(m.pg_ranks, c.pg_ranks),
    group_size = coalesce(len(m.pg_ranks), c.group_size),
    -- the recorder knows input from output (a trace's Input Dims of all_gather do not)
    dtype = coalesce(m.dtype, c.dtype),
    in_elems = coalesce(m.in_elems, c.in_elems),
    out_elems = coalesce(m.out_elems, c.out_elems),
    in_bytes = coalesce(m.in_elems * bprof_dtype_bytes(m.dtype), c.in_bytes),
    out_bytes = coalesce(m.out_elems * bprof_dtype_bytes(m.dtype), c.out_bytes)
FROM (
    SELECT f.rank, k.call_index, f.pg_name, f.pg_desc, f.seq, f.dtype, f.in_elems, f.out_elems, g.ranks AS pg_ranks
    FROM (SELECT *, bprof_canon_op(profiling_name) AS op FROM _flight_recorder WHERE NOT is_p2p) f
    ASOF JOIN (SELECT rank, call_index, op, cpu_ts_ns, cpu_ts_ns + cpu_dur_ns AS cpu_end_ns
               FROM collectives WHERE run_id = $run_id AND cpu_ts_ns IS NOT NULL) k
      ON f.rank = k.rank AND f.op = k.op AND f.time_created_ns >= k.cpu_ts_ns
    LEFT JOIN _pg_members g ON g.rank = f.rank AND g.pg_name = f.pg_name
    WHERE f.time_created_ns <= k.cpu_end_ns
) m
WHERE c.run_id = $run_id AND c.rank = m.rank AND c.call_index = m.call_index;

-- Send and recv: bprof's own log of each p2p call spans [time_created_ns, time_done_ns] around
-- the c10d::send / c10d::recv_ op, so a call belongs to the latest logged p2p call of its kind
-- that started at or before it and had not returned yet.
UPDATE collectives c
SET pg_name = m.pg_name, pg_desc = m.pg_desc, seq = m.seq, peer_rank = m.peer_rank,
    pg_ranks = coalesce(m.pg_ranks, c.pg_ranks), group_size = coalesce(len(m.pg_ranks), c.group_size),
    dtype = coalesce(c.dtype, m.dtype), in_elems = coalesce(c.in_elems, m.in_elems),
    in_bytes = coalesce(c.in_bytes, m.in_elems * bprof_dtype_bytes(m.dtype))
FROM (
    SELECT k.rank, k.call_index, f.pg_name, f.pg_desc, f.seq, f.peer_rank, f.dtype, f.in_elems, g.ranks AS pg_ranks
    FROM (SELECT rank, call_index, op, cpu_ts_ns FROM collectives
          WHERE run_id = $run_id AND is_p2p AND cpu_ts_ns IS NOT NULL) k
    ASOF JOIN (SELECT *, bprof_canon_op(profiling_name) AS op FROM _flight_recorder WHERE is_p2p) f
      ON f.rank = k.rank AND f.op = k.op AND k.cpu_ts_ns >= f.time_created_ns
    LEFT JOIN _pg_members g ON g.rank = f.rank AND g.pg_name = f.pg_name
    WHERE k.cpu_ts_ns <= f.time_done_ns
) m
WHERE c.run_id = $run_id AND c.rank = m.rank AND c.call_index = m.call_index;
