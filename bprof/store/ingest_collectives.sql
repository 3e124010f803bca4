-- Which collective and p2p calls did each rank of run $run_id make, with what message and
-- process group, and when did their device work run? Reads events; writes collectives.
--
-- Algorithm:
-- 1. A call is an outermost c10d::* / _c10d_functional::* CPU op, or a record_param_comms op
--    not nested in one (torch builds that trace only the latter). Waits are not calls: neither
--    a record_param_comms named wait nor, in older traces, a bare one that launches nothing.
-- 2. Its parts are the record_param_comms ops nested in it (same thread, inside its interval):
--    they carry op, sizes, dtype and process group on NCCL traces; a coalesced call has several.
--    A bare record_param_comms (2022 traces) takes op, dtype and input from its nccl:<op> range.
-- 3. Its device work is the NCCL kernels launched inside its interval (launch call on the same
--    thread, joined to the kernel by correlation id), else the gloo:* ranges nested in it, else
--    gloo:* ranges on gloo worker threads matched in order: the k-th unlinked range of an op to
--    the k-th unlinked call of that op on the rank, only when their counts agree.
-- 4. NCCL kernels and gloo ranges left over become kernel_only / gloo_only rows (older traces
--    without CPU comm ops, or CPU-only traces with only worker ranges).
-- 5. A send's peer is its Dst Rank, a recv's its Src Rank (their Seq numbers no message).
CREATE OR REPLACE TEMP MACRO bprof_op_key(raw) AS
    replace(regexp_replace(lower(raw), '^(c10d::|_c10d_functional::|nccl:|gloo:|rccl:|p2p:|nccl(dev)?kernel_)', ''), '_', '');

CREATE OR REPLACE TEMP MACRO bprof_canon_op(raw) AS CASE
    WHEN raw IS NULL THEN NULL
    WHEN starts_with(bprof_op_key(raw), 'allreduce') THEN 'all_reduce'
    WHEN starts_with(bprof_op_key(raw), 'allgather') THEN 'all_gather'
    WHEN starts_with(bprof_op_key(raw), 'reducescatter') THEN 'reduce_scatter'
    WHEN starts_with(bprof_op_key(raw), 'alltoall') THEN 'all_to_all'
    WHEN starts_with(bprof_op_key(raw), 'broadcast') THEN 'broadcast'
    WHEN starts_with(bprof_op_key(raw), 'reduce') THEN 'reduce'
    WHEN starts_with(bprof_op_key(raw), 'gather') THEN 'gather'
    WHEN starts_with(bprof_op_key(raw), 'scatter') THEN 'scatter'
    WHEN starts_with(bprof_op_key(raw), 'barrier') THEN 'barrier'
    WHEN starts_with(bprof_op_key(raw), 'sendrecv') THEN 'send_recv'
    WHEN starts_with(bprof_op_key(raw), 'send') THEN 'send'
    WHEN starts_with(bprof_op_key(raw), 'recv') THEN 'recv'
    ELSE 'unknown' END;

-- Bytes per element of the dtype spellings seen in traces (record_param_comms, Input type).
CREATE OR REPLACE TEMP MACRO bprof_dtype_bytes(dtype) AS CASE lower(regexp_replace(dtype, '^c10::', ''))
    WHEN 'float' THEN 4 WHEN 'float32' THEN 4 WHEN 'int' THEN 4 WHEN 'int32' THEN 4
    WHEN 'unsigned int' THEN 4 WHEN 'uint32' THEN 4 WHEN 'complexhalf' THEN 4
    WHEN 'double' THEN 8 WHEN 'float64' THEN 8 WHEN 'long' THEN 8 WHEN 'long int' THEN 8
    WHEN 'int64' THEN 8 WHEN 'long long' THEN 8 WHEN 'uint64' THEN 8 WHEN 'complexfloat' THEN 8
    WHEN 'complexdouble' THEN 16
    WHEN 'bfloat16' THEN 2 WHEN 'half' THEN 2 WHEN 'float16' THEN 2 WHEN 'short' THEN 2
    WHEN 'int16' THEN 2 WHEN 'short int' THEN 2
    WHEN 'byte' THEN 1 WHEN 'char' THEN 1 WHEN 'bool' THEN 1 WHEN 'int8' THEN 1 WHEN 'uint8' THEN 1
    WHEN 'unsigned char' THEN 1 WHEN 'signed char' THEN 1
    -- NCCL kernel-name spellings
    WHEN 'f32' THEN 4 WHEN 'i32' THEN 4 WHEN 'u32' THEN 4 WHEN 'f16' THEN 2 WHEN 'bf16' THEN 2
    WHEN 'f64' THEN 8 WHEN 'i64' THEN 8 WHEN 'u64' THEN 8 WHEN 'i8' THEN 1 WHEN 'u8' THEN 1
    ELSE CASE WHEN lower(dtype) LIKE '%float8%' OR lower(dtype) LIKE 'f8%' THEN 1 END END;

-- Element type in an NCCL reduction kernel's name (..._Sum_float(..., ..._Sum_bf16_RING_LL):
-- only reductions name the real type; broadcast, gather and send/recv kernels move int8 bytes.
CREATE OR REPLACE TEMP MACRO bprof_nccl_reduction_dtype(kernel_name) AS nullif(regexp_extract(kernel_name,
    '^nccl(?:Dev)?Kernel_(?:AllReduce|ReduceScatter|Reduce)_.*?_(?:Sum|Prod|Min|Max|Avg|PreMulSum|SumPostDiv)_([A-Za-z0-9]+?)(?:_t)?(?:[_(]|$)', 1), '');

CREATE OR REPLACE TEMP MACRO bprof_first_tensor_type(args) AS CASE
    WHEN args ->> '$."Input type"[0]' NOT IN ('', 'Scalar', 'TensorList', 'GenericList')
        THEN args ->> '$."Input type"[0]' END;

-- Elements of the first tensor argument from Input Dims: a tensor's dims, or a TensorList's.
-- Format trap: 2023 traces (the A100 16-rank job) write a TensorList as [] without its tensors'
-- dims: that is unknown (NULL), not one element. Only a tensor type makes dims [] a 0-d tensor.
CREATE OR REPLACE TEMP MACRO bprof_first_arg_elems(args) AS CASE
    WHEN json_type(args, '$."Input Dims"[0][0]') = 'ARRAY'
        THEN list_sum(list_transform(TRY_CAST(args -> '$."Input Dims"[0]' AS BIGINT[][]),
                                     lambda d: coalesce(list_aggregate(d, 'product'), 1)))
    WHEN json_type(args, '$."Input Dims"[0]') = 'ARRAY'
         AND (json_array_length(args, '$."Input Dims"[0]') > 0 OR bprof_first_tensor_type(args) IS NOT NULL)
         AND coalesce(args ->> '$."Input type"[0]', '') NOT IN ('TensorList', 'GenericList')
        THEN coalesce(list_aggregate(TRY_CAST(args -> '$."Input Dims"[0]' AS BIGINT[]), 'product'), 1)
    END;

INSERT INTO collectives
WITH ev AS (
    SELECT * FROM events WHERE run_id = $run_id
), candidates AS (
    SELECT row_number() OVER (ORDER BY rank, ts_ns, name) AS cid, rank, tid, name, ts_ns, dur_ns,
           ts_ns + dur_ns AS end_ns, external_id, step, args,
           CASE WHEN name = 'record_param_comms' THEN args ->> '$."Collective name"' END AS coll_name
    FROM ev
    WHERE kind = 'cpu_op'
      AND ((name LIKE 'c10d::%' OR name LIKE '\_c10d\_functional::%' ESCAPE '\')
           AND name NOT LIKE '%wait%'
           OR name = 'record_param_comms' AND coalesce(args ->> '$."Collective name"', '') <> 'wait')
), nesting AS (
    -- a candidate is nested when an earlier-starting one on its thread ends at or after its end
    SELECT *, max(end_ns) OVER (PARTITION BY rank, tid ORDER BY ts_ns, dur_ns DESC, cid
                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS outer_end_ns
    FROM candidates
), calls AS (
    SELECT * EXCLUDE (outer_end_ns) FROM nesting WHERE outer_end_ns IS NULL OR outer_end_ns < end_ns
), inner_rpc AS (
    -- outermost calls never overlap on one thread: the last call starting before an event is
    -- the only one that can contain it
    SELECT c.cid, r.args, r.ts_ns
    FROM candidates r ASOF JOIN calls c ON r.rank = c.rank AND r.tid = c.tid AND r.ts_ns >= c.ts_ns
    WHERE r.name = 'record_param_comms' AND r.end_ns <= c.end_ns
), parts AS (
    SELECT cid, count(*) AS num_parts, arg_min(args, ts_ns) AS rpc_args FROM inner_rpc GROUP BY cid
), inner_range AS (
    -- Format trap: traces of 2022 write a bare record_param_comms (no Collective name, no sizes)
    -- around torch's nccl:<op> range, which names the op and carries the Input Dims and type
    SELECT c.cid, arg_min(r.name, r.ts_ns) AS range_name, arg_min(r.args, r.ts_ns) AS range_args
    FROM (SELECT * FROM ev WHERE kind IN ('cpu_op', 'user_annotation') AND name LIKE 'nccl:%') r
    ASOF JOIN calls c ON r.rank = c.rank AND r.tid = c.tid AND r.ts_ns >= c.ts_ns
    WHERE r.ts_ns + r.dur_ns <= c.end_ns AND c.name = 'record_param_comms' AND c.coll_name IS NULL
    GROUP BY c.cid
), comm_kernels AS (
    SELECT row_number() OVER (ORDER BY rank, ts_ns) AS kid, rank, name, ts_ns, dur_ns, correlation,
           step, args
    FROM ev
    WHERE kind = 'kernel' AND (lower(name) LIKE 'nccl%' OR lower(name) LIKE 'rccl%')
), launches AS (
    -- runtime or driver calls: NCCL >= 2.27 on CUDA 12.9+ launches with cuLaunchKernelEx
    -- (cuda_driver); one launch per correlation id, the earliest (a call nested in another with
    -- the same id must not link its kernel twice)
    SELECT rank, tid, ts_ns, correlation FROM ev
    WHERE kind IN ('cuda_runtime', 'cuda_driver') AND correlation IN (SELECT correlation FROM comm_kernels)
    QUALIFY row_number() OVER (PARTITION BY rank, correlation ORDER BY ts_ns, tid) = 1
), call_kernels AS (
    SELECT c.cid, k.kid, k.ts_ns, k.dur_ns, k.name
    FROM launches l
    ASOF JOIN calls c ON l.rank = c.rank AND l.tid = c.tid AND l.ts_ns >= c.ts_ns
    JOIN comm_kernels k ON k.rank = l.rank AND k.correlation = l.correlation
    WHERE l.ts_ns <= c.end_ns
), gloo AS (
    SELECT row_number() OVER (ORDER BY rank, ts_ns) AS gid, rank, tid, name, ts_ns, dur_ns, step, args,
           bprof_canon_op(name) AS op
    FROM ev WHERE kind = 'user_annotation' AND name LIKE 'gloo:%'
), call_gloo_nested AS (
    SELECT c.cid, g.gid, g.ts_ns, g.dur_ns
    FROM gloo g ASOF JOIN calls c ON g.rank = c.rank AND g.tid = c.tid AND g.ts_ns >= c.ts_ns
    WHERE g.ts_ns + g.dur_ns <= c.end_ns
), calls_typed AS (
    SELECT c.*, p.num_parts, p.rpc_args, i.range_name, i.range_args,
           CASE WHEN c.name = 'record_param_comms' OR bprof_canon_op(c.name) = 'unknown'
                THEN coalesce(bprof_canon_op(p.rpc_args ->> '$."Collective name"'), bprof_canon_op(i.range_name),
                              bprof_canon_op(c.name))
                ELSE bprof_canon_op(c.name) END AS op
    FROM calls c LEFT JOIN parts p USING (cid) LEFT JOIN inner_range i USING (cid)
), unlinked_calls AS (
    SELECT cid, rank, op,
           row_number() OVER (PARTITION BY rank, op ORDER BY ts_ns, cid) AS k,
           count(*) OVER (PARTITION BY rank, op) AS n
    FROM calls_typed
    WHERE cid NOT IN (SELECT cid FROM call_kernels) AND cid NOT IN (SELECT cid FROM call_gloo_nested)
), unlinked_gloo AS (
    SELECT gid, rank, op, ts_ns, dur_ns,
           row_number() OVER (PARTITION BY rank, op ORDER BY ts_ns, gid) AS k,
           count(*) OVER (PARTITION BY rank, op) AS n
    FROM gloo WHERE gid NOT IN (SELECT gid FROM call_gloo_nested)
), ordered_match AS (
    SELECT c.cid, g.gid, g.ts_ns, g.dur_ns
    FROM unlinked_calls c JOIN unlinked_gloo g USING (rank, op, k, n)
), call_gloo AS (
    SELECT cid, gid FROM call_gloo_nested UNION ALL SELECT cid, gid FROM ordered_match
), call_gloo_args AS (
    SELECT n.cid, arg_min(g.args, g.ts_ns) AS gloo_args FROM call_gloo n JOIN gloo g USING (gid) GROUP BY n.cid
), work AS (
    SELECT cid, min(ts_ns) AS ts_ns, max(ts_ns + dur_ns) - min(ts_ns) AS dur_ns, count(*) AS n,
           arg_min(name, ts_ns) AS kernel_name
    FROM (SELECT cid, ts_ns, dur_ns, name FROM call_kernels
          UNION ALL SELECT cid, ts_ns, dur_ns, NULL FROM call_gloo_nested
          UNION ALL SELECT cid, ts_ns, dur_ns, NULL FROM ordered_match)
    GROUP BY cid
), from_calls AS (
    SELECT c.rank, c.op,
           CASE WHEN c.name = 'record_param_comms' THEN coalesce(c.coll_name, c.range_name, c.name) ELSE c.name END AS raw_name,
           CASE WHEN c.name = 'record_param_comms' THEN 'record_param_comms' ELSE 'c10d' END AS source,
           c.rpc_args AS info, coalesce(c.range_args, c.args) AS call_args, a.gloo_args, w.kernel_name,
           coalesce(c.num_parts, 1) AS num_parts, c.tid, c.ts_ns AS cpu_ts_ns, c.dur_ns AS cpu_dur_ns,
           w.ts_ns AS device_ts_ns, w.dur_ns AS device_dur_ns, coalesce(w.n, 0) AS num_kernels,
           c.external_id, c.step
    FROM calls_typed c LEFT JOIN work w USING (cid) LEFT JOIN call_gloo_args a USING (cid)
    -- older traces write Work.wait() as a bare record_param_comms: no name, no nccl:<op> range, no kernel
    WHERE NOT (c.name = 'record_param_comms' AND c.coll_name IS NULL AND c.range_name IS NULL AND w.n IS NULL)
), kernel_only AS (
    SELECT k.rank, bprof_canon_op(coalesce(k.args ->> '$."Collective name"', k.name)) AS op,
           k.name AS raw_name, 'kernel_only' AS source,
           CASE WHEN k.args ->> '$."Collective name"' IS NOT NULL THEN k.args END AS info,
           NULL::JSON AS call_args, NULL::JSON AS gloo_args, k.name AS kernel_name, 1 AS num_parts, NULL AS tid,
           NULL::BIGINT AS cpu_ts_ns, NULL::BIGINT AS cpu_dur_ns, k.ts_ns AS device_ts_ns,
           k.dur_ns AS device_dur_ns, 1 AS num_kernels, NULL::BIGINT AS external_id, k.step
    FROM comm_kernels k WHERE k.kid NOT IN (SELECT kid FROM call_kernels)
), gloo_only AS (
    SELECT g.rank, g.op, g.name AS raw_name, 'gloo_only' AS source, NULL::JSON AS info,
           NULL::JSON AS call_args, g.args AS gloo_args, NULL AS kernel_name, 1 AS num_parts, g.tid,
           NULL::BIGINT, NULL::BIGINT, g.ts_ns, g.dur_ns, 1, NULL::BIGINT, g.step
    FROM gloo g
    WHERE g.gid NOT IN (SELECT gid FROM call_gloo_nested)
      AND g.gid NOT IN (SELECT gid FROM ordered_match)
      AND (g.rank, g.op) NOT IN (SELECT (rank, op) FROM calls_typed)
), all_calls AS (
    SELECT * FROM from_calls UNION ALL SELECT * FROM kernel_only UNION ALL SELECT * FROM gloo_only
), described AS (
    SELECT *,
        info ->> '$."Process Group Name"' AS pg_name_,
        info ->> '$."Process Group Description"' AS pg_desc_,
        coalesce(TRY_CAST(TRY_CAST(info ->> '$."Process Group Ranks"' AS JSON) AS INTEGER[]),
                 CASE WHEN info ->> '$."Global rank start"' IS NOT NULL
                      THEN list_transform(range(0, TRY_CAST(info ->> '$."Group size"' AS INTEGER)),
                               lambda i: CAST(TRY_CAST(info ->> '$."Global rank start"' AS INTEGER)
                                         + i * TRY_CAST(info ->> '$."Global rank stride"' AS INTEGER) AS INTEGER))
                 END) AS pg_ranks_,
        TRY_CAST(info ->> '$."Group size"' AS INTEGER) AS group_size_,
        -- Format trap: on send/recv torch writes the group's collective counter + 1 as Seq, the same
        -- for every message until the next collective; match.sql numbers the messages within it.
        TRY_CAST(info ->> '$.Seq' AS BIGINT) AS seq_,
        -- the peer as a global rank: Dst Rank on a send, Src Rank on a recv (recent torch; the Rank
        -- key of a send/recv is the peer's rank within the group, not a global rank)
        CASE op WHEN 'send' THEN TRY_CAST(info ->> '$."Dst Rank"' AS INTEGER)
                WHEN 'recv' THEN TRY_CAST(info ->> '$."Src Rank"' AS INTEGER) END AS peer_rank_,
        coalesce(info ->> '$.dtype', bprof_first_tensor_type(call_args), bprof_first_tensor_type(gloo_args),
                 bprof_nccl_reduction_dtype(kernel_name)) AS dtype_,
        coalesce(TRY_CAST(info ->> '$."In msg nelems"' AS BIGINT),
                 bprof_first_arg_elems(call_args), bprof_first_arg_elems(gloo_args)) AS in_elems_,
        TRY_CAST(info ->> '$."Out msg nelems"' AS BIGINT) AS out_elems_
    FROM all_calls
)
SELECT $run_id, rank,
       CAST(row_number() OVER (PARTITION BY rank ORDER BY coalesce(cpu_ts_ns, device_ts_ns), raw_name) - 1 AS INTEGER),
       op, raw_name, source, op IN ('send', 'recv'), CASE WHEN peer_rank_ >= 0 THEN peer_rank_ END,
       pg_name_, pg_desc_, pg_ranks_, coalesce(group_size_, len(pg_ranks_)), seq_, dtype_,
       in_elems_, out_elems_,
       in_elems_ * bprof_dtype_bytes(dtype_), out_elems_ * bprof_dtype_bytes(dtype_),
       num_parts, tid, cpu_ts_ns, cpu_dur_ns, device_ts_ns, device_dur_ns, num_kernels,
       external_id, step
FROM described;

-- A rank with a single process group: every call without group information was made on it.
UPDATE collectives c
SET pg_name = pg ->> '$.pg_name', pg_desc = pg ->> '$.pg_desc',
    pg_ranks = TRY_CAST(pg -> '$.ranks' AS INTEGER[]),
    group_size = coalesce(c.group_size, TRY_CAST(pg ->> '$.pg_size' AS INTEGER))
FROM (SELECT rank, distributed_info -> '$.pg_config[0]' AS pg
      FROM ranks
      WHERE run_id = $run_id AND json_array_length(distributed_info -> '$.pg_config') = 1) r
WHERE c.run_id = $run_id AND c.rank = r.rank AND c.pg_name IS NULL;
