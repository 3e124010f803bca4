-- How much memory does each rank hold per step, which operators allocate most, and does a rank
-- hold more than its peers? From the allocator's `[memory]` instant events (profile_memory=True).
-- Reads timeline_spans, events; writes memory_steps and memory_top_ops.
--
-- Definitions:
-- * Each `[memory]` event is one allocation (Bytes > 0) or free (Bytes < 0) on one device
--   (Device Type 0 = cpu, 1 = cuda:<Device Id>). Modern traces also write the allocator's
--   "Total Allocated" and "Total Reserved" after the event: the level is absolute. Older traces
--   (2021) write only Bytes: the level is the running sum of Bytes from the first event of the
--   trace, relative to what was allocated when the trace started (baseline = trace_start).
-- * Events at one timestamp are taken in the trace's own order ("Ev Idx"), else allocations first.
-- * An event belongs to the step whose span holds it; an allocation belongs to the top-level
--   operator (not nested in another operator) running on its thread at that instant.

CREATE TABLE IF NOT EXISTS memory_steps (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, device VARCHAR NOT NULL,
    peak_allocated_bytes BIGINT NOT NULL, start_allocated_bytes BIGINT NOT NULL, end_allocated_bytes BIGINT NOT NULL,
    peak_reserved_bytes BIGINT, num_allocs BIGINT NOT NULL, alloc_bytes BIGINT NOT NULL, baseline VARCHAR NOT NULL,
    PRIMARY KEY (run_id, rank, step, device)
);
COMMENT ON TABLE memory_steps IS 'Allocated memory per rank, step and device, from the allocator''s [memory] events.';
COMMENT ON COLUMN memory_steps.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN memory_steps.rank IS 'Global rank.';
COMMENT ON COLUMN memory_steps.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN memory_steps.device IS 'cpu, cuda:<index>, or device<type>:<index> for other device types.';
COMMENT ON COLUMN memory_steps.peak_allocated_bytes IS 'Highest allocated level in the step (including the level it started at).';
COMMENT ON COLUMN memory_steps.start_allocated_bytes IS 'Allocated level just before the step''s first memory event.';
COMMENT ON COLUMN memory_steps.end_allocated_bytes IS 'Allocated level after the step''s last memory event.';
COMMENT ON COLUMN memory_steps.peak_reserved_bytes IS 'Highest level reserved by the caching allocator in the step; NULL when the trace does not record it.';
COMMENT ON COLUMN memory_steps.num_allocs IS 'Allocations (events with Bytes > 0) in the step.';
COMMENT ON COLUMN memory_steps.alloc_bytes IS 'Bytes allocated in the step (sum of positive Bytes).';
COMMENT ON COLUMN memory_steps.baseline IS 'absolute (the allocator''s Total Allocated) or trace_start (running sum of Bytes: relative to the level when the trace started).';

CREATE TABLE IF NOT EXISTS memory_top_ops (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, device VARCHAR NOT NULL, name VARCHAR NOT NULL,
    num_allocs BIGINT NOT NULL, alloc_bytes BIGINT NOT NULL, max_alloc_bytes BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, device, name)
);
COMMENT ON TABLE memory_top_ops IS 'The operators that allocate most per rank and device (top N by bytes, all analysed steps).';
COMMENT ON COLUMN memory_top_ops.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN memory_top_ops.rank IS 'Global rank.';
COMMENT ON COLUMN memory_top_ops.device IS 'Device of the allocations (memory_steps.device).';
COMMENT ON COLUMN memory_top_ops.name IS 'Top-level operator running on the allocating thread, or (outside any op).';
COMMENT ON COLUMN memory_top_ops.num_allocs IS 'Allocations made inside it.';
COMMENT ON COLUMN memory_top_ops.alloc_bytes IS 'Bytes they allocated.';
COMMENT ON COLUMN memory_top_ops.max_alloc_bytes IS 'Largest single allocation.';

CREATE OR REPLACE TEMP TABLE _memory_ev AS
WITH raw AS (
    SELECT rank, tid, ts_ns,
        TRY_CAST(args->>'$."Device Type"' AS INTEGER) AS device_type,
        TRY_CAST(args->>'$."Device Id"' AS INTEGER) AS device_id,
        TRY_CAST(args->>'$.Bytes' AS BIGINT) AS bytes,
        TRY_CAST(args->>'$."Total Allocated"' AS BIGINT) AS total_allocated,
        TRY_CAST(args->>'$."Total Reserved"' AS BIGINT) AS total_reserved,
        TRY_CAST(args->>'$."Ev Idx"' AS BIGINT) AS ev_idx
    FROM events
    WHERE run_id = $run_id AND kind = 'instant' AND name = '[memory]'
), labelled AS (
    SELECT *, CASE device_type WHEN 0 THEN 'cpu' WHEN 1 THEN 'cuda:' || coalesce(device_id, 0)
                   ELSE 'device' || coalesce(device_type, -1) || ':' || coalesce(device_id, 0) END AS device
    FROM raw WHERE bytes IS NOT NULL
), levels AS (
    SELECT *,
        bool_and(total_allocated IS NOT NULL) OVER (PARTITION BY rank, device) AS absolute,
        sum(bytes) OVER (PARTITION BY rank, device ORDER BY ts_ns, ev_idx NULLS LAST, bytes DESC
                         ROWS UNBOUNDED PRECEDING) AS running_bytes,
        row_number() OVER (PARTITION BY rank, device ORDER BY ts_ns, ev_idx NULLS LAST, bytes DESC) AS seq
    FROM labelled
)
SELECT rank, tid, ts_ns, device, bytes, seq, total_reserved,
    CASE WHEN absolute THEN total_allocated ELSE running_bytes END AS level_bytes,
    CASE WHEN absolute THEN 'absolute' ELSE 'trace_start' END AS baseline
FROM levels;

INSERT INTO memory_steps
WITH in_span AS (
    SELECT s.step, m.* FROM _memory_ev m JOIN timeline_spans s ON s.run_id = $run_id AND s.rank = m.rank
        AND m.ts_ns >= s.ts_ns AND m.ts_ns < s.ts_ns + s.dur_ns
)
SELECT $run_id, rank, step, device,
    greatest(max(level_bytes), arg_min(level_bytes - bytes, seq)), arg_min(level_bytes - bytes, seq), arg_max(level_bytes, seq),
    max(total_reserved), count(*) FILTER (WHERE bytes > 0), coalesce(sum(bytes) FILTER (WHERE bytes > 0), 0),
    any_value(baseline)
FROM in_span GROUP BY rank, step, device;

-- Algorithm: top-level operators of a thread never overlap, so an ASOF join on (rank, tid, start)
-- finds the only one that can hold an allocation; it holds it when it has not ended yet.
INSERT INTO memory_top_ops
WITH ops AS (
    SELECT rank, tid, name, ts_ns, ts_ns + dur_ns AS end_ns,
        max(ts_ns + dur_ns) OVER (PARTITION BY rank, tid ORDER BY ts_ns, dur_ns DESC
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
    FROM events WHERE run_id = $run_id AND kind = 'cpu_op' AND dur_ns > 0 AND name NOT LIKE 'ProfilerStep#%'
), top_ops AS (
    SELECT rank, tid, name, ts_ns, end_ns FROM ops WHERE prev_end_ns IS NULL OR prev_end_ns <= ts_ns
), allocs AS (
    SELECT m.* FROM _memory_ev m JOIN timeline_spans s ON s.run_id = $run_id AND s.rank = m.rank
        AND m.ts_ns >= s.ts_ns AND m.ts_ns < s.ts_ns + s.dur_ns
    WHERE m.bytes > 0
), held AS (
    SELECT a.rank, a.device, a.bytes, CASE WHEN a.ts_ns < o.end_ns THEN o.name END AS name
    FROM allocs a ASOF LEFT JOIN top_ops o ON o.rank = a.rank AND o.tid = a.tid AND a.ts_ns >= o.ts_ns
)
SELECT $run_id, rank, device, coalesce(name, '(outside any op)'), count(*), sum(bytes), max(bytes)
FROM held GROUP BY rank, device, coalesce(name, '(outside any op)')
QUALIFY row_number() OVER (PARTITION BY rank, device ORDER BY sum(bytes) DESC, coalesce(name, '(outside any op)')) <= $top_n;
