-- Which phase of the training step (data wait, forward, backward, recompute, optimizer, other) is
-- each rank's host in, for how long per step, and how much device work does each phase launch?
-- Reads timeline_spans, timeline_threads, events, collectives, reduced_ranks; writes phases_steps and phases_ranks. Reduced ranks
-- (ingested from `bprof reduce` output) have no events, hence no phases: they get no rows.
--
-- Definitions. The host of a rank is its main thread (timeline_spans) plus every thread that runs
-- backward ranges (the autograd engine's device threads on GPU runs; the main thread blocks in
-- loss.backward() meanwhile). On the host:
-- * optimizer: inside an `Optimizer.step#...` or `Optimizer.zero_grad#...` range (clipped to the
--   span: a ProfilerStep boundary can fall inside Optimizer.step).
-- * data_wait: inside a data-loading range (`enumerate(DataLoader)#...__next__`, or any range whose
--   name contains "dataloader", such as bprof/dataloader). A rank with no such range anywhere: the
--   host-idle time (in no op, no user range and no CUDA runtime call: a cudaDeviceSynchronize waits
--   for the device)
--   of a step before its first forward op, except while a collective of the rank runs on a rank
--   without device kernels (gloo: the training thread blocked in an FSDP unshard or a DDP bucket
--   wait records no op; it is waiting for a peer, never for data).
-- * backward: inside an `autograd::engine::evaluate_function: ...` range or a `*Backward*` op.
-- * recompute: an op with a `Sequence number` inside a backward range: activation checkpointing
--   re-runs the forward during the backward (torch.utils.checkpoint, reentrant or not, shows no
--   range of its own). The autograd dispatcher writes a Sequence number only in grad mode, and the
--   backward itself runs without grad mode (unless create_graph=True, e.g. double backward, which
--   would be counted here too).
-- * forward: an op outside backward ranges that recorded an autograd node (it has a Sequence number
--   and the next such op on its thread has a larger one: the counter moved), starting before the
--   end of its step's last backward range. Ops in grad mode that record no node (loss logging,
--   hand-written gradient all-reduce buckets) are not forward. A rank whose ops carry no Sequence
--   number (old traces): any op outside the other phases, with the same last-backward limit.
-- * Priority where several apply: optimizer, data_wait, recompute, backward, forward.
-- * Time in none of these (Python between ops, unclassified ops, communication at top level) takes
--   the phase of the activity before and after it when both are the same phase, else it is other.
--   So a phase's wall time runs from its first op to its last op in each contiguous stretch.
-- The phases of a step tile its span on the host (timeline_spans.host_ts_ns/host_dur_ns: where
-- the device lags, the step span is the device's, later than the host's): their dur_ns sum to it.

CREATE TABLE IF NOT EXISTS phases_steps (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, phase VARCHAR NOT NULL,
    dur_ns BIGINT NOT NULL, share_frac DOUBLE NOT NULL,
    device_busy_ns BIGINT, device_idle_ns BIGINT, num_device_ops BIGINT,
    PRIMARY KEY (run_id, rank, step, phase)
);
COMMENT ON TABLE phases_steps IS 'Wall time of each training phase per rank and step on the host; the phases of a step tile its span.';
COMMENT ON COLUMN phases_steps.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN phases_steps.rank IS 'Global rank.';
COMMENT ON COLUMN phases_steps.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN phases_steps.phase IS 'data_wait, forward, backward, recompute, optimizer or other (definitions in phases.sql).';
COMMENT ON COLUMN phases_steps.dur_ns IS 'Host wall time in the phase within the step span (main thread and autograd threads).';
COMMENT ON COLUMN phases_steps.share_frac IS 'dur_ns / the step''s span on the host (timeline_spans.host_dur_ns); the phases of a step sum to 1.';
COMMENT ON COLUMN phases_steps.device_busy_ns IS 'Union of the device activity (kernels, memcpy, memset) launched from this phase (runtime call to device op by correlation id), clipped to the span; NULL on CPU traces.';
COMMENT ON COLUMN phases_steps.device_idle_ns IS 'Part of dur_ns during which the device ran nothing at all: the phase''s time exposed on the device; NULL on CPU traces.';
COMMENT ON COLUMN phases_steps.num_device_ops IS 'Device operations (kernels, memcpy, memset) launched from this phase; NULL on CPU traces.';

CREATE TABLE IF NOT EXISTS phases_ranks (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, phase VARCHAR NOT NULL, num_steps INTEGER NOT NULL,
    mean_ns BIGINT NOT NULL, median_ns BIGINT NOT NULL, share_frac DOUBLE NOT NULL, median_device_idle_ns BIGINT,
    PRIMARY KEY (run_id, rank, phase)
);
COMMENT ON TABLE phases_ranks IS 'Each rank''s phases over its analysed steps.';
COMMENT ON COLUMN phases_ranks.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN phases_ranks.rank IS 'Global rank.';
COMMENT ON COLUMN phases_ranks.phase IS 'data_wait, forward, backward, recompute, optimizer or other.';
COMMENT ON COLUMN phases_ranks.num_steps IS 'Number of step spans analysed.';
COMMENT ON COLUMN phases_ranks.mean_ns IS 'The phase''s wall time over all analysed steps / num_steps: the per-step time that share_frac is the share of (mean_ns = share_frac x the mean step).';
COMMENT ON COLUMN phases_ranks.median_ns IS 'Median over steps of the phase''s wall time per step (not comparable with share_frac when a few steps are unlike the rest).';
COMMENT ON COLUMN phases_ranks.share_frac IS 'Share of the rank''s total span time in this phase (time-weighted over steps); the phases of a rank sum to 1.';
COMMENT ON COLUMN phases_ranks.median_device_idle_ns IS 'Median over steps of phases_steps.device_idle_ns; NULL on CPU traces.';

-- Host threads: the main thread of each rank, and every thread with backward ranges.
CREATE OR REPLACE TEMP TABLE _phases_threads AS
SELECT rank, tid FROM timeline_threads WHERE run_id = $run_id;

-- Host ranges and ops with what each is. Algorithm: ranges on one thread nest, so an op lies inside
-- a backward range exactly when the running maximum end of the backward ranges that start no later
-- than it (in start order, backward ranges first on ties) is past its start. The autograd sequence
-- counter is per thread and grows by one with each node recorded, so an op recorded a node exactly
-- when the next op with a Sequence number on its thread (in start order) carries a larger one.
CREATE OR REPLACE TEMP TABLE _phases_host AS
WITH ev AS (
    SELECT e.rank, e.tid, e.kind, e.name, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns,
        (e.name LIKE 'Optimizer.step#%' OR e.name LIKE 'Optimizer.zero_grad#%') AS is_opt,
        (e.name LIKE 'enumerate(DataLoader)#%' OR lower(e.name) LIKE '%dataloader%') AS is_data,
        (e.kind = 'cpu_op' AND (e.name LIKE 'autograd::engine::evaluate_function:%' OR e.name LIKE '%Backward%')) AS is_bwd,
        CASE WHEN e.kind = 'cpu_op' AND e.name NOT LIKE 'autograd::%' AND e.name NOT LIKE 'torch::autograd::%'
                  AND e.name NOT LIKE '%Backward%'
             THEN TRY_CAST(e.args->>'$."Sequence number"' AS BIGINT) END AS seq
    FROM events e JOIN _phases_threads t ON t.rank = e.rank AND t.tid = e.tid
    WHERE e.run_id = $run_id AND e.kind IN ('cpu_op', 'user_annotation') AND e.dur_ns > 0
      AND e.name NOT LIKE 'ProfilerStep#%'
), nested AS (
    SELECT *, seq IS NOT NULL AS has_seq,
        coalesce(max(CASE WHEN is_bwd THEN end_ns END) OVER (
            PARTITION BY rank, tid ORDER BY ts_ns, is_bwd DESC, end_ns DESC
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) > ts_ns AS in_bwd,
        -- the last one of a thread: assumed to record a node (the last-backward rule below still applies)
        coalesce(seq < lead(seq IGNORE NULLS) OVER (PARTITION BY rank, tid ORDER BY ts_ns, end_ns DESC), true) AS records_node
    FROM ev
), seq_known AS (
    SELECT rank, bool_or(seq IS NOT NULL) AS seq_known FROM ev GROUP BY rank
), data_known AS (
    SELECT rank, bool_or(is_data) AS data_known FROM ev GROUP BY rank
)
SELECT n.*, s.seq_known, d.data_known,
    CASE WHEN n.is_opt THEN 0
         WHEN n.is_data THEN 1
         WHEN n.kind = 'cpu_op' AND n.in_bwd AND n.has_seq THEN 2
         WHEN n.is_bwd THEN 3
         WHEN n.kind = 'cpu_op' AND NOT n.in_bwd AND ((n.has_seq AND n.records_node) OR NOT s.seq_known) THEN 4
    END AS cls
FROM nested n JOIN seq_known s USING (rank) JOIN data_known d USING (rank);

-- Ranks with device kernels (GPU traces).
CREATE OR REPLACE TEMP TABLE _phases_kernel_ranks AS
SELECT DISTINCT rank FROM events WHERE run_id = $run_id AND kind = 'kernel';

-- The intervals of every span, clipped to it: 0 optimizer, 1 data_wait, 2 recompute, 3 backward,
-- 4 forward, 5 device activity (GPU traces; the collectives' ranges on ranks without kernels),
-- 6 any host op, user range or runtime call, 7 the span itself.
CREATE OR REPLACE TEMP TABLE _phases_iv AS
WITH spans AS (
    -- the step on the host (where the device lags, the device span is later than the host's step)
    SELECT rank, step, host_ts_ns AS ts_ns, host_ts_ns + host_dur_ns AS end_ns FROM timeline_spans
    WHERE run_id = $run_id AND dur_ns > 0 AND host_dur_ns > 0
), host AS (
    SELECT rank, tid, ts_ns, end_ns, cls FROM _phases_host WHERE cls IS NOT NULL
    UNION ALL
    -- a user's own range (record_function, bprof.annotate) is the host running the user's code, even
    -- where its ops leave Python between them: a rank's 100 ms loop of small matmuls before forward
    -- was 20 ms of "waiting for data" in its gaps
    SELECT rank, tid, ts_ns, end_ns, 6 FROM _phases_host WHERE kind IN ('cpu_op', 'user_annotation')
    UNION ALL
    -- a CUDA/HIP runtime or driver call outside every op is the host at work too: most often a
    -- synchronize (torch.cuda.synchronize() records no op, only cudaDeviceSynchronize), which is
    -- waiting for the device, never for data
    SELECT e.rank, e.tid, e.ts_ns, e.ts_ns + e.dur_ns, 6
    FROM events e JOIN _phases_threads t ON t.rank = e.rank AND t.tid = e.tid
    WHERE e.run_id = $run_id AND e.kind IN ('cuda_runtime', 'cuda_driver') AND e.dur_ns > 0
    UNION ALL
    SELECT rank, 'stream ' || coalesce(stream, -1), ts_ns, ts_ns + dur_ns, 5 FROM events
    WHERE run_id = $run_id AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND dur_ns > 0
    UNION ALL
    -- on a rank without kernels the collectives' own ranges (a gloo worker's) stand in for the device
    SELECT c.rank, 'comm', c.device_ts_ns, c.device_ts_ns + c.device_dur_ns, 5 FROM collectives c
    WHERE c.run_id = $run_id AND c.device_dur_ns > 0 AND c.rank NOT IN (SELECT rank FROM _phases_kernel_ranks)
), outermost AS (
    -- an interval inside an earlier one of its class on its thread adds nothing to the class: most
    -- ops are children of other ops, and the sweep below costs by the interval
    SELECT * FROM host
    QUALIFY coalesce(max(end_ns) OVER (PARTITION BY rank, tid, cls ORDER BY ts_ns, end_ns DESC
                                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), -1) < end_ns
), clipped AS (
    SELECT s.rank, s.step, h.cls, greatest(h.ts_ns, s.ts_ns) AS ts_ns, least(h.end_ns, s.end_ns) AS end_ns
    FROM outermost h JOIN spans s ON s.rank = h.rank AND h.ts_ns < s.end_ns AND h.end_ns > s.ts_ns
), last_bwd AS (
    SELECT rank, step, max(end_ns) AS last_bwd_end_ns FROM clipped WHERE cls IN (2, 3) GROUP BY rank, step
)
SELECT {'rank': c.rank, 'step': c.step} AS key, c.cls, c.ts_ns, c.end_ns
FROM clipped c LEFT JOIN last_bwd b USING (rank, step)
WHERE c.cls <> 4 OR b.last_bwd_end_ns IS NULL OR c.ts_ns < b.last_bwd_end_ns
UNION ALL
SELECT {'rank': rank, 'step': step}, 7, ts_ns, end_ns FROM spans;

-- Algorithm: label each elementary segment by the priority above; then a segment with no phase
-- takes the phase of the nearest labelled segments before and after it when they agree (the data
-- fallback first: host-idle time before the step's first forward op on a rank without data ranges).
CREATE OR REPLACE TEMP TABLE _phases_seg AS
WITH seg AS (
    SELECT key.rank AS rank, key.step AS step, ts_ns, end_ns, mask & 32 > 0 AS device_active, mask & 64 > 0 AS in_op,
        CASE WHEN mask & 1 > 0 THEN 'optimizer' WHEN mask & 2 > 0 THEN 'data_wait' WHEN mask & 4 > 0 THEN 'recompute'
             WHEN mask & 8 > 0 THEN 'backward' WHEN mask & 16 > 0 THEN 'forward' END AS label
    FROM iv_segments('_phases_iv')
    WHERE mask & 128 > 0
), ctx AS (
    SELECT *,
        last_value(label IGNORE NULLS) OVER (PARTITION BY rank, step ORDER BY ts_ns
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_label,
        first_value(label IGNORE NULLS) OVER (PARTITION BY rank, step ORDER BY ts_ns
            ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS next_label,
        coalesce(max(CASE WHEN label = 'forward' THEN 1 ELSE 0 END) OVER (PARTITION BY rank, step ORDER BY ts_ns
            ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) = 1 AS after_forward,
        coalesce(max(CASE WHEN label = 'forward' THEN 1 ELSE 0 END) OVER (PARTITION BY rank, step ORDER BY ts_ns
            ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING), 0) = 1 AS before_forward
    FROM seg
)
SELECT c.rank, c.step, c.ts_ns, c.end_ns, c.device_active,
    CASE WHEN c.label IS NOT NULL THEN c.label
         WHEN NOT c.in_op AND NOT c.after_forward AND c.before_forward AND NOT coalesce(d.data_known, false)
              AND NOT (c.device_active AND k.rank IS NULL) THEN 'data_wait'
         WHEN c.prev_label = c.next_label THEN c.prev_label
         ELSE 'other' END AS phase
FROM ctx c
LEFT JOIN (SELECT DISTINCT rank, data_known FROM _phases_host) d USING (rank)
LEFT JOIN _phases_kernel_ranks k USING (rank);

-- Device work launched from each phase: runtime calls on host threads, matched to device ops by
-- correlation id; the launch's phase is the phase of the segment holding the call's start.
CREATE OR REPLACE TEMP TABLE _phases_launched AS
WITH launches AS (
    SELECT e.rank, e.ts_ns, e.correlation
    FROM events e JOIN _phases_threads t ON t.rank = e.rank AND t.tid = e.tid
    WHERE e.run_id = $run_id AND e.kind IN ('cuda_runtime', 'cuda_driver') AND e.correlation IS NOT NULL
), dev AS (
    SELECT rank, correlation, ts_ns, ts_ns + dur_ns AS end_ns FROM events
    WHERE run_id = $run_id AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND correlation IS NOT NULL
), phased AS (
    -- segments of a rank never overlap: the one starting last at or before the call may hold it
    SELECT l.rank, l.correlation, s.step, s.phase
    FROM launches l ASOF JOIN _phases_seg s ON s.rank = l.rank AND l.ts_ns >= s.ts_ns
    WHERE l.ts_ns < s.end_ns
)
SELECT {'rank': p.rank, 'step': p.step, 'phase': p.phase} AS key, 0 AS cls,
    greatest(d.ts_ns, sp.ts_ns) AS ts_ns, least(d.end_ns, sp.ts_ns + sp.dur_ns) AS end_ns
FROM phased p
JOIN dev d ON d.rank = p.rank AND d.correlation = p.correlation
JOIN timeline_spans sp ON sp.run_id = $run_id AND sp.rank = p.rank AND sp.step = p.step;

INSERT INTO phases_steps
WITH phases AS (
    SELECT * FROM (VALUES ('data_wait'), ('forward'), ('backward'), ('recompute'), ('optimizer'), ('other')) v(phase)
), host AS (
    SELECT rank, step, phase, sum(end_ns - ts_ns) AS dur_ns,
        sum(end_ns - ts_ns) FILTER (WHERE NOT device_active) AS idle_ns
    FROM _phases_seg GROUP BY ALL
), busy AS (
    SELECT key.rank AS rank, key.step AS step, key.phase AS phase, sum(end_ns - ts_ns) AS busy_ns
    FROM iv_union('_phases_launched') GROUP BY ALL
), ops AS (
    SELECT key.rank AS rank, key.step AS step, key.phase AS phase, count(*) AS num_ops
    FROM _phases_launched GROUP BY ALL
)
SELECT $run_id, s.rank, s.step, p.phase,
    CAST(coalesce(h.dur_ns, 0) AS BIGINT), coalesce(h.dur_ns, 0) / s.host_dur_ns,
    CASE WHEN s.timeline = 'device' THEN CAST(coalesce(b.busy_ns, 0) AS BIGINT) END,
    CASE WHEN s.timeline = 'device' THEN CAST(coalesce(h.idle_ns, 0) AS BIGINT) END,
    CASE WHEN s.timeline = 'device' THEN coalesce(o.num_ops, 0) END
FROM timeline_spans s CROSS JOIN phases p
LEFT JOIN host h ON h.rank = s.rank AND h.step = s.step AND h.phase = p.phase
LEFT JOIN busy b ON b.rank = s.rank AND b.step = s.step AND b.phase = p.phase
LEFT JOIN ops o ON o.rank = s.rank AND o.step = s.step AND o.phase = p.phase
WHERE s.run_id = $run_id AND s.dur_ns > 0 AND s.host_dur_ns > 0 AND s.rank NOT IN (SELECT rank FROM reduced_ranks WHERE run_id = $run_id);

INSERT INTO phases_ranks
SELECT $run_id, p.rank, p.phase, count(*), CAST(round(avg(p.dur_ns)) AS BIGINT), CAST(median(p.dur_ns) AS BIGINT),
    sum(p.dur_ns) / sum(s.host_dur_ns), CAST(median(p.device_idle_ns) AS BIGINT)
FROM phases_steps p JOIN timeline_spans s ON s.run_id = p.run_id AND s.rank = p.rank AND s.step = p.step
WHERE p.run_id = $run_id
GROUP BY p.rank, p.phase;
