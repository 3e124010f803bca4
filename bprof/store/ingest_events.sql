-- Which events does a batch of rank traces hold, normalised? Reads the events arrays that
-- kineto_file.split_trace wrote (one per rank, listed in _batch_files(array_path, rank,
-- base_ns)) and appends them to events for run $run_id, with step still NULL.
-- Time trap: modern traces write float us relative to baseTimeNanoseconds, older ones absolute
-- epoch us (sometimes with ns decimals). Reading ts as DECIMAL keeps every digit, so
-- ts_ns = base_ns + ts * 1000 is exact; a double would be off by up to 125 ns on absolute traces.
INSERT INTO events
WITH raw AS (
    SELECT f.rank, f.base_ns, e.*
    FROM read_json($paths, format = 'array', filename = true, maximum_object_size = 67108864,
                   columns = {ph: 'VARCHAR', cat: 'VARCHAR', name: 'VARCHAR', pid: 'VARCHAR',
                              tid: 'VARCHAR', ts: 'DECIMAL(22,3)', dur: 'DECIMAL(22,3)',
                              id: 'VARCHAR', args: 'JSON'}) e
    JOIN _batch_files f ON f.array_path = e.filename
), typed AS (
    SELECT *,
        CASE
            WHEN ph = 'M' THEN 'metadata'
            WHEN ph = 's' THEN 'flow_start'
            WHEN ph IN ('f', 't') THEN 'flow_end'
            WHEN ph IN ('i', 'I') THEN 'instant'
            ELSE CASE lower(cat)
                WHEN 'cpu_op' THEN 'cpu_op'
                WHEN 'operator' THEN 'cpu_op'
                WHEN 'user_annotation' THEN 'user_annotation'
                WHEN 'gpu_user_annotation' THEN 'gpu_user_annotation'
                WHEN 'kernel' THEN 'kernel'
                WHEN 'gpu_memcpy' THEN 'gpu_memcpy'
                WHEN 'memcpy' THEN 'gpu_memcpy'
                WHEN 'gpu_memset' THEN 'gpu_memset'
                WHEN 'memset' THEN 'gpu_memset'
                WHEN 'cuda_runtime' THEN 'cuda_runtime'
                WHEN 'runtime' THEN 'cuda_runtime'
                WHEN 'cuda_driver' THEN 'cuda_driver'
                WHEN 'python_function' THEN 'python_function'
                WHEN 'trace' THEN 'trace_span'
                ELSE 'other'
            END
        END AS kind
    FROM raw
), gpu AS (
    SELECT *, kind IN ('kernel', 'gpu_memcpy', 'gpu_memset', 'gpu_user_annotation') AS on_device
    FROM typed
)
SELECT
    $run_id,
    rank,
    kind,
    cat,
    name,
    pid,
    tid,
    CASE WHEN on_device
         THEN coalesce(TRY_CAST(args ->> '$.device' AS INTEGER), TRY_CAST(pid AS INTEGER)) END,
    CASE WHEN on_device
         THEN coalesce(TRY_CAST(args ->> '$.stream' AS BIGINT),
                       TRY_CAST(regexp_extract(tid, '(-?\d+)', 1) AS BIGINT)) END,
    base_ns + CAST(ts * 1000 AS BIGINT),
    coalesce(CAST(dur * 1000 AS BIGINT), 0),
    CASE WHEN kind IN ('flow_start', 'flow_end') THEN TRY_CAST(id AS BIGINT)
         WHEN kind IN ('cuda_runtime', 'cuda_driver') OR on_device THEN TRY_CAST(args ->> '$.correlation' AS BIGINT)
    END,
    TRY_CAST(coalesce(args ->> '$."External id"', args ->> '$."external id"') AS BIGINT),
    NULL,
    args
FROM gpu;
