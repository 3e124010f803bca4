-- Where does each rank's step time go? Partitions every span of timeline_spans into compute,
-- exposed communication, overlapped communication, memcpy, idle and other (fractions sum to 1),
-- measures HTA's comm_overlap_frac, and splits communication by parallel dimension.
-- Reads timeline_spans, events, collectives, runs and the temp tables _classes (name, kind ->
-- coarse_class, built from bprof.kernels by breakdown.py) and _bd_kernel_dims (catalogue rule ->
-- the parallel dimension its kernels serve, breakdown.py); writes breakdown_steps,
-- breakdown_ranks, breakdown_groups, breakdown_dims and breakdown_idle_gaps. A reduced rank (from
-- `bprof reduce` output: no events) brings its partition (reduced_breakdown), its exposed
-- communication intervals (reduced_exposed_comm) and its communication per parallel dimension
-- (reduced_dims), which the reduce computed with this same file; it has no idle gaps.
--
-- Definitions (the README repeats them):
-- * The span partitioned is timeline_spans': on the device timeline the step on the device (the
--   device work the step launched, so a device that lags its host is partitioned where it ran the
--   step, not over a CPU range it was still busy with earlier steps in).
-- * Device timeline (GPU traces): every kernel, memcpy and memset of the rank, all streams.
--   Classes are the kernel catalogue's coarse ones: comm, memory, sync, compute (all the rest,
--   unknown included, as HolisticTraceAnalysis counts it).
-- * CPU traces: the training (main) thread stands in for the device. compute = its namespaced
--   ops (aten::..., not c10d::/autograd::/profiler::); exposed communication = time it is blocked
--   in a c10d call, a wait or a gloo:* range, or time when a gloo:* range runs on a worker thread
--   while it computes nothing; overlapped communication = gloo:* work on worker threads while it
--   computes; other = inside any other range (autograd wrappers, data loading, optimizer glue);
--   idle = in no range at all (Python between ops), or in a bprof/gc.gen<N> garbage-collection range.
-- * Each instant of a span gets one label, in this priority: main thread blocked in
--   communication -> exposed_comm; communication and compute -> overlapped_comm; compute ->
--   compute; communication -> exposed_comm; memcpy/memset -> memcpy; sync or other range ->
--   other; nothing -> idle.
-- * comm_overlap_frac = |comm ∩ compute| / |comm| (HTA's ratio) = overlapped / (overlapped + exposed).

CREATE TABLE IF NOT EXISTS breakdown_steps (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL,
    timeline VARCHAR NOT NULL, span_ns BIGINT NOT NULL,
    compute_ns BIGINT NOT NULL, exposed_comm_ns BIGINT NOT NULL, overlapped_comm_ns BIGINT NOT NULL,
    memcpy_ns BIGINT NOT NULL, idle_ns BIGINT NOT NULL, other_ns BIGINT NOT NULL,
    compute_frac DOUBLE NOT NULL, exposed_comm_frac DOUBLE NOT NULL, overlapped_comm_frac DOUBLE NOT NULL,
    memcpy_frac DOUBLE NOT NULL, idle_frac DOUBLE NOT NULL, other_frac DOUBLE NOT NULL,
    comm_overlap_frac DOUBLE,
    exposed_wait_ns BIGINT, exposed_transfer_ns BIGINT,
    PRIMARY KEY (run_id, rank, step)
);
COMMENT ON TABLE breakdown_steps IS 'Partition of each rank''s step span: the *_frac columns sum to 1.';
COMMENT ON COLUMN breakdown_steps.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN breakdown_steps.rank IS 'Global rank.';
COMMENT ON COLUMN breakdown_steps.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN breakdown_steps.timeline IS 'device (GPU activity) or main_thread (CPU traces).';
COMMENT ON COLUMN breakdown_steps.span_ns IS 'Step span length (timeline_spans.dur_ns): the step time.';
COMMENT ON COLUMN breakdown_steps.compute_ns IS 'Compute with no communication running.';
COMMENT ON COLUMN breakdown_steps.exposed_comm_ns IS 'Communication not hidden under compute (waiting for peers + transfer).';
COMMENT ON COLUMN breakdown_steps.overlapped_comm_ns IS 'Communication running while compute runs (hidden).';
COMMENT ON COLUMN breakdown_steps.memcpy_ns IS 'Memcpy/memset with no compute or communication.';
COMMENT ON COLUMN breakdown_steps.idle_ns IS 'Nothing running on the device (GPU), or the main thread in no range (CPU).';
COMMENT ON COLUMN breakdown_steps.other_ns IS 'Sync kernels only (GPU); inside a non-compute range such as autograd glue or data loading (CPU).';
COMMENT ON COLUMN breakdown_steps.compute_frac IS 'compute_ns / span_ns.';
COMMENT ON COLUMN breakdown_steps.exposed_comm_frac IS 'exposed_comm_ns / span_ns.';
COMMENT ON COLUMN breakdown_steps.overlapped_comm_frac IS 'overlapped_comm_ns / span_ns.';
COMMENT ON COLUMN breakdown_steps.memcpy_frac IS 'memcpy_ns / span_ns.';
COMMENT ON COLUMN breakdown_steps.idle_frac IS 'idle_ns / span_ns.';
COMMENT ON COLUMN breakdown_steps.other_frac IS 'other_ns / span_ns.';
COMMENT ON COLUMN breakdown_steps.comm_overlap_frac IS 'HTA''s ratio |comm ∩ compute| / |comm|; NULL without communication.';
COMMENT ON COLUMN breakdown_steps.exposed_wait_ns IS 'Part of exposed_comm_ns spent before the last peer arrived; NULL until cross-rank analysis aligns clocks (not yet attributable).';
COMMENT ON COLUMN breakdown_steps.exposed_transfer_ns IS 'exposed_comm_ns - exposed_wait_ns; NULL while exposed_wait_ns is.';

CREATE TABLE IF NOT EXISTS breakdown_ranks (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, timeline VARCHAR NOT NULL, num_steps INTEGER NOT NULL,
    span_ns BIGINT NOT NULL, median_step_ns BIGINT NOT NULL,
    compute_frac DOUBLE NOT NULL, exposed_comm_frac DOUBLE NOT NULL, overlapped_comm_frac DOUBLE NOT NULL,
    memcpy_frac DOUBLE NOT NULL, idle_frac DOUBLE NOT NULL, other_frac DOUBLE NOT NULL,
    comm_overlap_frac DOUBLE,
    PRIMARY KEY (run_id, rank)
);
COMMENT ON TABLE breakdown_ranks IS 'The partition of each rank over all its analysed steps (time-weighted).';
COMMENT ON COLUMN breakdown_ranks.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN breakdown_ranks.rank IS 'Global rank.';
COMMENT ON COLUMN breakdown_ranks.timeline IS 'device or main_thread.';
COMMENT ON COLUMN breakdown_ranks.num_steps IS 'Number of step spans analysed.';
COMMENT ON COLUMN breakdown_ranks.span_ns IS 'Sum of the step spans.';
COMMENT ON COLUMN breakdown_ranks.median_step_ns IS 'Median step span.';
COMMENT ON COLUMN breakdown_ranks.compute_frac IS 'Share of span_ns in compute (no communication running).';
COMMENT ON COLUMN breakdown_ranks.exposed_comm_frac IS 'Share of span_ns in exposed communication.';
COMMENT ON COLUMN breakdown_ranks.overlapped_comm_frac IS 'Share of span_ns with communication hidden under compute.';
COMMENT ON COLUMN breakdown_ranks.memcpy_frac IS 'Share of span_ns in memcpy/memset only.';
COMMENT ON COLUMN breakdown_ranks.idle_frac IS 'Share of span_ns idle.';
COMMENT ON COLUMN breakdown_ranks.other_frac IS 'Share of span_ns in other.';
COMMENT ON COLUMN breakdown_ranks.comm_overlap_frac IS '|comm ∩ compute| / |comm| over all steps; NULL without communication.';

CREATE TABLE IF NOT EXISTS breakdown_groups (
    run_id INTEGER NOT NULL, pg_name VARCHAR, pg_desc VARCHAR, pg_ranks INTEGER[], group_size INTEGER,
    dim VARCHAR NOT NULL, dim_source VARCHAR NOT NULL, num_calls BIGINT NOT NULL
);
COMMENT ON TABLE breakdown_groups IS 'Each process group of the run and the parallel dimension it serves.';
COMMENT ON COLUMN breakdown_groups.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN breakdown_groups.pg_name IS 'Process group name as traced.';
COMMENT ON COLUMN breakdown_groups.pg_desc IS 'Process group description as traced.';
COMMENT ON COLUMN breakdown_groups.pg_ranks IS 'Global ranks of the group.';
COMMENT ON COLUMN breakdown_groups.group_size IS 'Number of ranks in the group.';
COMMENT ON COLUMN breakdown_groups.dim IS 'Parallel dimension: tp, dp, fsdp, pp, cp, ep, embedding (Megatron''s tied-embedding group of the first and last pipeline stages), world (the default group of a job that also has other groups) or unknown.';
COMMENT ON COLUMN breakdown_groups.dim_source IS 'pg_desc (the description names it), p2p (send/recv only: pipeline), layout (inferred from the rank stride; dp only on runs with a backward) or none.';
COMMENT ON COLUMN breakdown_groups.num_calls IS 'Collective and p2p calls on the group, all ranks.';

CREATE TABLE IF NOT EXISTS breakdown_dims (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, dim VARCHAR NOT NULL,
    comm_ns BIGINT NOT NULL, exposed_comm_ns BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step, dim)
);
COMMENT ON TABLE breakdown_dims IS 'Communication time per parallel dimension; dimensions running at once each count the shared time.';
COMMENT ON COLUMN breakdown_dims.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN breakdown_dims.rank IS 'Global rank.';
COMMENT ON COLUMN breakdown_dims.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN breakdown_dims.dim IS 'Parallel dimension (breakdown_groups.dim).';
COMMENT ON COLUMN breakdown_dims.comm_ns IS 'Time any call of this dimension was in flight (CPU call or device work), communication kernels outside c10d (symmetric memory, DeepEP, ...) included.';
COMMENT ON COLUMN breakdown_dims.exposed_comm_ns IS 'Part of comm_ns that was exposed (labelled exposed_comm in breakdown_steps).';

CREATE TABLE IF NOT EXISTS breakdown_idle_gaps (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, ts_ns BIGINT NOT NULL, dur_ns BIGINT NOT NULL
);
COMMENT ON TABLE breakdown_idle_gaps IS 'Each maximal idle interval of the device timeline (the input of idle attribution).';
COMMENT ON COLUMN breakdown_idle_gaps.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN breakdown_idle_gaps.rank IS 'Global rank.';
COMMENT ON COLUMN breakdown_idle_gaps.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN breakdown_idle_gaps.ts_ns IS 'Gap start, own clock.';
COMMENT ON COLUMN breakdown_idle_gaps.dur_ns IS 'Gap length.';

-- The ranks with events, whose partition and per-dimension time this file computes (reduced ranks
-- bring theirs). At scale nearly every rank is reduced: filtering on this early keeps their
-- collectives and exposed segments out of the interval work.
CREATE OR REPLACE TEMP TABLE _bd_event_ranks AS
SELECT rank FROM ranks WHERE run_id = $run_id AND rank NOT IN (SELECT rank FROM reduced_ranks WHERE run_id = $run_id);

-- The intervals of every span, clipped to it, with their class: 0 compute, 1 communication (device
-- or worker thread), 2 memcpy/memset, 3 sync (GPU) or other range (CPU main thread), 4 main thread
-- blocked in communication (CPU), 7 the span itself (so idle time has a segment too).
CREATE OR REPLACE TEMP TABLE _bd_iv AS
WITH spans AS (
    SELECT rank, step, ts_ns, ts_ns + dur_ns AS end_ns, timeline, main_tid
    FROM timeline_spans WHERE run_id = $run_id AND rank IN (SELECT rank FROM _bd_event_ranks)
), dev AS (
    SELECT e.rank, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns,
        CASE c.coarse_class WHEN 'comm' THEN 1 WHEN 'memory' THEN 2 WHEN 'sync' THEN 3 ELSE 0 END AS cls
    FROM events e JOIN _classes c ON c.name = e.name AND c.kind = e.kind
    WHERE e.run_id = $run_id AND e.kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND e.dur_ns > 0
), cpu AS (
    SELECT e.rank, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns, e.tid = r.main_tid AS on_main, e.kind, e.name,
        (e.name LIKE 'c10d::%' OR e.name LIKE 'gloo:%' OR e.name = 'record_param_comms'
         OR e.name IN ('wait', 'c10d::wait', 'aten::wait', 'Work.wait()', 'WorkNCCL.wait')) AS is_comm
    FROM events e JOIN (SELECT DISTINCT rank, main_tid FROM spans WHERE timeline = 'main_thread') r USING (rank)
    WHERE e.run_id = $run_id AND e.kind IN ('cpu_op', 'user_annotation') AND e.dur_ns > 0
      AND e.name NOT LIKE 'ProfilerStep#%'
), cpu_cls AS (
    SELECT rank, ts_ns, end_ns, 4 AS cls FROM cpu WHERE on_main AND is_comm
    UNION ALL
    SELECT rank, ts_ns, end_ns, 1 FROM cpu WHERE NOT on_main AND name LIKE 'gloo:%'
    UNION ALL
    SELECT rank, ts_ns, end_ns, 0 FROM cpu
    WHERE on_main AND NOT is_comm AND kind = 'cpu_op' AND name LIKE '%::%'
      AND name NOT LIKE 'autograd::%' AND name NOT LIKE 'profiler::%'
    UNION ALL
    -- a garbage-collection pause (bprof/gc.gen<N>, recorded by bprof) does no work: it stays idle,
    -- and idle attribution names it
    SELECT rank, ts_ns, end_ns, 3 FROM cpu WHERE on_main AND NOT is_comm AND name NOT LIKE 'bprof/gc.%'
), clipped AS (
    SELECT {'rank': s.rank, 'step': s.step} AS key, i.cls,
        greatest(i.ts_ns, s.ts_ns) AS ts_ns, least(i.end_ns, s.end_ns) AS end_ns
    FROM (SELECT * FROM dev UNION ALL SELECT * FROM cpu_cls) i
    JOIN spans s ON s.rank = i.rank AND i.ts_ns < s.end_ns AND i.end_ns > s.ts_ns
)
SELECT * FROM clipped
UNION ALL
SELECT {'rank': rank, 'step': step}, 7, ts_ns, end_ns FROM spans;

CREATE OR REPLACE TEMP TABLE _bd_seg AS
SELECT key.rank AS rank, key.step AS step, ts_ns, end_ns,
    CASE WHEN mask & 16 > 0 THEN 'exposed_comm'
         WHEN mask & 3 = 3 THEN 'overlapped_comm'
         WHEN mask & 1 > 0 THEN 'compute'
         WHEN mask & 2 > 0 THEN 'exposed_comm'
         WHEN mask & 4 > 0 THEN 'memcpy'
         WHEN mask & 8 > 0 THEN 'other'
         ELSE 'idle' END AS label
FROM iv_segments('_bd_iv')
WHERE mask & 128 > 0
UNION ALL
SELECT rank, step, ts_ns, ts_ns + dur_ns, 'exposed_comm' FROM reduced_exposed_comm WHERE run_id = $run_id;

INSERT INTO breakdown_steps
WITH sums AS (
    SELECT rank, step,
        sum(end_ns - ts_ns) FILTER (WHERE label = 'compute') AS compute_ns,
        sum(end_ns - ts_ns) FILTER (WHERE label = 'exposed_comm') AS exposed_comm_ns,
        sum(end_ns - ts_ns) FILTER (WHERE label = 'overlapped_comm') AS overlapped_comm_ns,
        sum(end_ns - ts_ns) FILTER (WHERE label = 'memcpy') AS memcpy_ns,
        sum(end_ns - ts_ns) FILTER (WHERE label = 'idle') AS idle_ns,
        sum(end_ns - ts_ns) FILTER (WHERE label = 'other') AS other_ns
    FROM _bd_seg JOIN _bd_event_ranks USING (rank) GROUP BY rank, step
), ns AS (
    SELECT s.rank, s.step, s.timeline, s.dur_ns AS span_ns,
        CAST(coalesce(compute_ns, 0) AS BIGINT) AS compute_ns, CAST(coalesce(exposed_comm_ns, 0) AS BIGINT) AS exposed_comm_ns,
        CAST(coalesce(overlapped_comm_ns, 0) AS BIGINT) AS overlapped_comm_ns, CAST(coalesce(memcpy_ns, 0) AS BIGINT) AS memcpy_ns,
        CAST(coalesce(idle_ns, 0) AS BIGINT) AS idle_ns, CAST(coalesce(other_ns, 0) AS BIGINT) AS other_ns
    FROM timeline_spans s LEFT JOIN sums USING (rank, step)
    WHERE s.run_id = $run_id AND s.dur_ns > 0 AND s.rank IN (SELECT rank FROM _bd_event_ranks)
    UNION ALL
    SELECT rank, step, timeline, span_ns, compute_ns, exposed_comm_ns, overlapped_comm_ns, memcpy_ns, idle_ns, other_ns
    FROM reduced_breakdown WHERE run_id = $run_id
)
SELECT $run_id, rank, step, timeline, span_ns,
    compute_ns, exposed_comm_ns, overlapped_comm_ns, memcpy_ns, idle_ns, other_ns,
    compute_ns / span_ns, exposed_comm_ns / span_ns, overlapped_comm_ns / span_ns,
    memcpy_ns / span_ns, idle_ns / span_ns, other_ns / span_ns,
    CASE WHEN overlapped_comm_ns + exposed_comm_ns > 0
         THEN overlapped_comm_ns / (overlapped_comm_ns + exposed_comm_ns) END,
    NULL, NULL
FROM ns;

INSERT INTO breakdown_ranks
SELECT $run_id, rank, any_value(timeline), count(*), sum(span_ns), CAST(median(span_ns) AS BIGINT),
    sum(compute_ns) / sum(span_ns), sum(exposed_comm_ns) / sum(span_ns), sum(overlapped_comm_ns) / sum(span_ns),
    sum(memcpy_ns) / sum(span_ns), sum(idle_ns) / sum(span_ns), sum(other_ns) / sum(span_ns),
    CASE WHEN sum(overlapped_comm_ns + exposed_comm_ns) > 0
         THEN sum(overlapped_comm_ns) / sum(overlapped_comm_ns + exposed_comm_ns) END
FROM breakdown_steps WHERE run_id = $run_id
GROUP BY rank;

INSERT INTO breakdown_idle_gaps
WITH marked AS (
    SELECT rank, step, ts_ns, end_ns, label,
        -- a segment boundary can fall inside one gap: adjacent idle segments are one gap
        CASE WHEN label = 'idle' AND lag(label) OVER w = 'idle' AND lag(end_ns) OVER w = ts_ns THEN 0 ELSE 1 END AS starts
    FROM _bd_seg WINDOW w AS (PARTITION BY rank, step ORDER BY ts_ns)
), grouped AS (
    SELECT *, sum(starts) OVER (PARTITION BY rank, step ORDER BY ts_ns ROWS UNBOUNDED PRECEDING) AS gap
    FROM marked
)
SELECT $run_id, rank, step, min(ts_ns), max(end_ns) - min(ts_ns)
FROM grouped WHERE label = 'idle'
GROUP BY rank, step, gap;

-- Algorithm: a group's dimension comes from its description when it names one (Megatron's
-- *_PARALLEL_GROUP names, torchtitan/DeviceMesh dims tp, dp_shard, dp_replicate, pp, cp, ep);
-- else a group used only by send/recv is pipeline; else the rank layout decides: consecutive
-- ranks (stride 1, fewer than all) are tensor parallel (Megatron and torchtitan put tp innermost),
-- any other strided subgroup data parallel, and the whole world "world" -- or dp when every call
-- of the run is on whole-world groups (plain DDP/FSDP). Data parallelism by layout needs a
-- backward (gradients to synchronise): on a run without one (inference: vLLM's TP=8 group is the
-- whole world, its all-reduces inside every layer's forward) those groups are unknown, never dp.
-- A reduced rank's dimensions (reduced_dims) come from its reduce, which ran this statement on its
-- own calls alone. Names from descriptions and the stride layout (pg_ranks is the same list on every
-- member) come out the same, but a group can get another dimension there where the answer depends
-- on other ranks' calls: p2p (a group where this rank only sends and receives but others run
-- collectives is pp there), the whole world (dp there when all the rank's own groups are whole-world,
-- world here when other ranks use subgroups), and a trace that states no world size (the reduce
-- then takes 1, the ranks it ingested, so no group is whole-world and the world group is classified
-- by its stride). breakdown_groups is the run's view; the README says the same.
INSERT INTO breakdown_groups
WITH g AS (
    SELECT pg_name, pg_desc, pg_ranks, any_value(group_size) AS group_size, count(*) AS num_calls,
        bool_and(is_p2p) AS only_p2p
    FROM collectives WHERE run_id = $run_id GROUP BY pg_name, pg_desc, pg_ranks
), w AS (
    -- training: some rank ran a backward (autograd engine ranges or *Backward ops), or, for ranks
    -- known only from `bprof reduce` output, a reduce that saw one gave a group a data dimension
    SELECT coalesce(world_size, num_ranks_ingested) AS world_size,
        EXISTS (SELECT 1 FROM _classes WHERE kind = 'cpu_op'
                AND (name LIKE 'autograd::engine::evaluate_function:%' OR name LIKE '%Backward%'))
        OR EXISTS (SELECT 1 FROM reduced_dims WHERE run_id = $run_id AND dim IN ('dp', 'fsdp')) AS training
    FROM runs WHERE run_id = $run_id
), named AS (
    SELECT g.*, w.world_size, w.training, upper(coalesce(pg_desc, '')) AS d,
        CASE WHEN pg_ranks IS NOT NULL AND len(pg_ranks) > 1
             THEN list_distinct(list_transform(list_zip(list_slice(list_sort(pg_ranks), 2, len(pg_ranks)),
                                                        list_slice(list_sort(pg_ranks), 1, len(pg_ranks) - 1)),
                                               lambda p: p[1] - p[2])) END AS strides
    FROM g, w
), classified AS (
    SELECT *,
        -- Megatron's EMBEDDING_GROUP / POSITION_EMBEDDING_GROUP: the first and last pipeline stages
        -- all-reduce their tied embeddings' gradients; its one stride looks like data parallelism
        CASE WHEN d LIKE '%EMBEDDING%' THEN 'embedding'
             WHEN d LIKE '%TENSOR%' OR d SIMILAR TO '(.*[^A-Z])?TP([^A-Z].*)?' THEN 'tp'
             WHEN d LIKE '%PIPELINE%' OR d SIMILAR TO '(.*[^A-Z])?PP([^A-Z].*)?' THEN 'pp'
             WHEN d LIKE '%EXPERT%' OR d LIKE '%MOE%' OR d SIMILAR TO '(.*[^A-Z])?EP([^A-Z].*)?' THEN 'ep'
             WHEN d LIKE '%CONTEXT%' OR d SIMILAR TO '(.*[^A-Z])?CP([^A-Z].*)?' THEN 'cp'
             WHEN d LIKE '%FSDP%' OR d LIKE '%DP_SHARD%' OR d LIKE '%SHARD%' THEN 'fsdp'
             WHEN d LIKE '%DATA_PARALLEL%' OR d LIKE '%DP_REPLICATE%' OR d SIMILAR TO '(.*[^A-Z])?DP([^A-Z].*)?' THEN 'dp'
        END AS desc_dim
    FROM named
)
SELECT $run_id, pg_name, pg_desc, pg_ranks, group_size,
    CASE WHEN desc_dim IS NOT NULL THEN desc_dim
         WHEN only_p2p THEN 'pp'
         WHEN group_size IS NOT NULL AND group_size = world_size
             THEN CASE WHEN NOT (SELECT bool_and(group_size = world_size) FROM named) THEN 'world'
                       WHEN training THEN 'dp' ELSE 'unknown' END
         WHEN strides = [1] THEN 'tp'
         WHEN len(strides) = 1 AND training THEN 'dp'
         ELSE 'unknown' END,
    CASE WHEN desc_dim IS NOT NULL THEN 'pg_desc' WHEN only_p2p THEN 'p2p'
         WHEN group_size IS NOT NULL AND group_size = world_size
             THEN CASE WHEN training OR NOT (SELECT bool_and(group_size = world_size) FROM named) THEN 'layout' ELSE 'none' END
         WHEN strides = [1] OR (len(strides) = 1 AND training) THEN 'layout'
         ELSE 'none' END,
    num_calls
FROM classified;

-- Algorithm: each call contributes its CPU call and its device (or gloo worker) interval, clipped
-- to the step spans; per dimension the union of those is comm_ns, and its intersection with the
-- exposed_comm segments is exposed_comm_ns. Only ranks with events: a reduced rank's reduce did this
-- on its own (reduced_dims, copied below), and its calls are most of the rows at scale.
-- Communication kernels that no collectives row holds (the catalogue's communication class minus
-- NCCL's kernels, which ingest always makes rows of, and minus kernels inside a row's device time):
-- torch symmetric memory, DeepEP, TransformerEngine userbuffers, vLLM's own all-reduce. None goes
-- through c10d, so no process group names them: each is its own call, of the dimension that the
-- kind of kernel implies (_bd_kernel_dims: DeepEP is expert parallel), else unknown. The partition
-- already counts them as communication; without this their exposed time reached no dimension.
CREATE OR REPLACE TEMP TABLE _bd_calls AS
WITH kernel_only AS (
    SELECT e.rank, coalesce(d.dim, 'unknown') AS dim, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns
    FROM events e JOIN _classes c ON c.name = e.name AND c.kind = e.kind
    LEFT JOIN _bd_kernel_dims d ON d.rule_id = c.rule_id
    WHERE e.run_id = $run_id AND e.kind IN ('kernel', 'gpu_memcpy') AND e.dur_ns > 0
      AND c.coarse_class = 'comm' AND c.rule_id NOT LIKE 'comm_nccl%'
      AND e.rank IN (SELECT rank FROM _bd_event_ranks)
      AND NOT EXISTS (SELECT 1 FROM collectives k
                      WHERE k.run_id = $run_id AND k.rank = e.rank AND k.device_ts_ns IS NOT NULL
                        AND e.ts_ns >= k.device_ts_ns AND e.ts_ns + e.dur_ns <= k.device_ts_ns + k.device_dur_ns)
), own AS (
    SELECT c.rank, coalesce(g.dim, 'unknown') AS dim, c.cpu_ts_ns, c.cpu_dur_ns, c.device_ts_ns, c.device_dur_ns
    FROM collectives c JOIN _bd_event_ranks USING (rank)
    LEFT JOIN breakdown_groups g ON g.run_id = c.run_id AND g.pg_name IS NOT DISTINCT FROM c.pg_name
         AND g.pg_desc IS NOT DISTINCT FROM c.pg_desc AND g.pg_ranks IS NOT DISTINCT FROM c.pg_ranks
    WHERE c.run_id = $run_id
), calls AS (
    SELECT rank, dim, cpu_ts_ns AS ts_ns, cpu_ts_ns + cpu_dur_ns AS end_ns FROM own WHERE cpu_ts_ns IS NOT NULL
    UNION ALL
    SELECT rank, dim, device_ts_ns, device_ts_ns + device_dur_ns FROM own WHERE device_ts_ns IS NOT NULL
    UNION ALL
    SELECT rank, dim, ts_ns, end_ns FROM kernel_only
)
SELECT {'rank': s.rank, 'step': s.step, 'dim': calls.dim} AS key, 0 AS cls,
    greatest(calls.ts_ns, s.ts_ns) AS ts_ns, least(calls.end_ns, s.ts_ns + s.dur_ns) AS end_ns
FROM calls JOIN timeline_spans s ON s.run_id = $run_id AND s.rank = calls.rank
     AND calls.ts_ns < s.ts_ns + s.dur_ns AND calls.end_ns > s.ts_ns;

CREATE OR REPLACE TEMP TABLE _bd_call_union AS SELECT * FROM iv_union('_bd_calls');

-- Algorithm: a dimension's exposed time is the overlap of its calls' union with the exposed_comm
-- segments, found by an equi-join on (rank, step, 1 ms time bucket): each interval is listed in
-- every bucket it touches and overlaps are clipped to the bucket, so each is counted once. Joining
-- on (rank, step) alone compares every call with every segment of its step (2,000 x 2,000 pairs
-- per rank-step at scale: 36 s at 1,024 ranks against 3.5 s bucketed).
INSERT INTO breakdown_dims
WITH total AS (
    SELECT key, sum(end_ns - ts_ns) AS comm_ns FROM _bd_call_union GROUP BY key
), ub AS (
    SELECT key, ts_ns, end_ns, unnest(range(ts_ns // 1000000, (end_ns - 1) // 1000000 + 1)) AS bucket FROM _bd_call_union
), xb AS (
    SELECT rank, step, ts_ns, end_ns, unnest(range(ts_ns // 1000000, (end_ns - 1) // 1000000 + 1)) AS bucket
    FROM _bd_seg JOIN _bd_event_ranks USING (rank) WHERE label = 'exposed_comm' AND end_ns > ts_ns
), exposed AS (
    SELECT key, sum(overlap_ns) AS exposed_ns FROM (
        SELECT ub.key, least(ub.end_ns, xb.end_ns, (ub.bucket + 1) * 1000000)
                       - greatest(ub.ts_ns, xb.ts_ns, ub.bucket * 1000000) AS overlap_ns
        FROM ub JOIN xb ON xb.rank = ub.key.rank AND xb.step = ub.key.step AND xb.bucket = ub.bucket
         AND xb.ts_ns < ub.end_ns AND xb.end_ns > ub.ts_ns)
    WHERE overlap_ns > 0 GROUP BY key
)
SELECT $run_id, t.key.rank, t.key.step, t.key.dim, CAST(t.comm_ns AS BIGINT), CAST(coalesce(e.exposed_ns, 0) AS BIGINT)
FROM total t LEFT JOIN exposed e USING (key)
UNION ALL
-- reduced ranks: their reduce's rows, named by the dimensions it gave their own groups (see breakdown_groups)
SELECT $run_id, rank, step, dim, comm_ns, exposed_comm_ns FROM reduced_dims WHERE run_id = $run_id;
