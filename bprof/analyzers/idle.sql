-- Why is the device idle? For each idle interval of breakdown_idle_gaps, what the rank's host was
-- doing meanwhile: syncing, collecting garbage, loading data, launching work, or anything else.
-- Reads breakdown_idle_gaps, timeline_spans, events; writes idle_causes, idle_gaps, idle_segments and idle_ops.
--
-- Definitions. The host threads are the rank's main thread and every thread with backward ranges
-- (the autograd engine's). Each instant of a gap gets one cause, in this priority:
-- * gc: any thread of the rank is inside a `bprof/gc.gen<N>` range (a Python garbage collection
--   recorded by bprof record).
-- * data_loading: any thread is inside a data-loading range (`enumerate(DataLoader)#...`, or a
--   range whose name contains "dataloader").
-- * sync: the gap is sync-caused, or a host thread is inside a sync call (cudaStreamSynchronize,
--   cudaDeviceSynchronize, cudaEventSynchronize, their hip* twins, aten::item,
--   aten::_local_scalar_dense). A gap is sync-caused when it starts while a host thread is blocked
--   in a sync call (or continues such a gap across a step boundary): the sync drained the device's
--   queue, so from then on the device waits for every launch the host makes after it returns.
-- * launch_bound: a host thread is inside an operator (cpu_op) or a CUDA/HIP runtime or driver
--   call: the device waits for the host to dispatch ops and launch their work (what CUDA graphs
--   and torch.compile remove). CPU work inside an op (e.g. DDP's unflatten_dense_tensors) counts
--   here too; idle_ops names the operators that hold the time.
-- * host_other: none of these: Python between ops, user ranges.
-- On CPU traces the gaps are the main thread in no range at all, or in a bprof/gc.gen<N> range
-- (breakdown counts every other range, data loading included, as busy): gc or host_other occur
-- there, the latter being Python overhead between ops.

CREATE TABLE IF NOT EXISTS idle_causes (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, cause VARCHAR NOT NULL,
    dur_ns BIGINT NOT NULL, num_gaps BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step, cause)
);
COMMENT ON TABLE idle_causes IS 'Device idle time per rank, step and host cause; the causes of a step sum to breakdown_steps.idle_ns.';
COMMENT ON COLUMN idle_causes.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN idle_causes.rank IS 'Global rank.';
COMMENT ON COLUMN idle_causes.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN idle_causes.cause IS 'sync, gc, data_loading, launch_bound or host_other (definitions in idle.sql).';
COMMENT ON COLUMN idle_causes.dur_ns IS 'Idle time of the step attributed to this cause.';
COMMENT ON COLUMN idle_causes.num_gaps IS 'Number of idle gaps with some time of this cause.';

CREATE TABLE IF NOT EXISTS idle_gaps (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, ts_ns BIGINT NOT NULL,
    dur_ns BIGINT NOT NULL, sync_caused BOOLEAN NOT NULL, main_cause VARCHAR NOT NULL, main_cause_ns BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step, ts_ns)
);
COMMENT ON TABLE idle_gaps IS 'Each idle gap of breakdown_idle_gaps with the cause that holds most of it.';
COMMENT ON COLUMN idle_gaps.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN idle_gaps.rank IS 'Global rank.';
COMMENT ON COLUMN idle_gaps.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN idle_gaps.ts_ns IS 'Gap start, own clock.';
COMMENT ON COLUMN idle_gaps.dur_ns IS 'Gap length.';
COMMENT ON COLUMN idle_gaps.sync_caused IS 'The gap started while a host thread was blocked in a sync call.';
COMMENT ON COLUMN idle_gaps.main_cause IS 'The cause with the most time in the gap (ties: the priority order).';
COMMENT ON COLUMN idle_gaps.main_cause_ns IS 'Time of main_cause in the gap.';

CREATE TABLE IF NOT EXISTS idle_segments (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, ts_ns BIGINT NOT NULL,
    dur_ns BIGINT NOT NULL, cause VARCHAR NOT NULL
);
COMMENT ON TABLE idle_segments IS 'The idle time of each gap cut where its cause changes: the pieces idle_causes sums; the what-if scenario no-host-gaps:CAUSE removes those of one cause.';
COMMENT ON COLUMN idle_segments.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN idle_segments.rank IS 'Global rank.';
COMMENT ON COLUMN idle_segments.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN idle_segments.ts_ns IS 'Start of the piece, own clock.';
COMMENT ON COLUMN idle_segments.dur_ns IS 'Length of the piece.';
COMMENT ON COLUMN idle_segments.cause IS 'Its cause (idle_causes.cause).';

CREATE TABLE IF NOT EXISTS idle_ops (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, cause VARCHAR NOT NULL, name VARCHAR NOT NULL,
    dur_ns BIGINT NOT NULL, num_gaps BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, cause, name)
);
COMMENT ON TABLE idle_ops IS 'The host operators holding the most idle time of each cause (top N per rank and cause, all steps).';
COMMENT ON COLUMN idle_ops.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN idle_ops.rank IS 'Global rank.';
COMMENT ON COLUMN idle_ops.cause IS 'Cause of the idle time (idle_causes.cause).';
COMMENT ON COLUMN idle_ops.name IS 'Name of the top-level operator (not nested in another operator on its thread) the host was inside.';
COMMENT ON COLUMN idle_ops.dur_ns IS 'Idle time of this cause spent inside the operator, summed over the analysed steps.';
COMMENT ON COLUMN idle_ops.num_gaps IS 'Number of idle gaps it overlaps.';

CREATE OR REPLACE TEMP TABLE _idle_threads AS
SELECT rank, tid FROM timeline_threads WHERE run_id = $run_id;

-- Host intervals inside the gaps, clipped to them: 0 gc range, 1 data-loading range, 2 sync call,
-- 3 operator or runtime call on a host thread, 7 the gap itself.
CREATE OR REPLACE TEMP TABLE _idle_iv AS
WITH gaps AS (
    SELECT rank, step, ts_ns, ts_ns + dur_ns AS end_ns FROM breakdown_idle_gaps WHERE run_id = $run_id AND dur_ns > 0
), spans AS (
    SELECT rank, step, ts_ns, ts_ns + dur_ns AS end_ns FROM timeline_spans WHERE run_id = $run_id
), ev AS (
    SELECT e.rank, e.tid, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns,
        CASE WHEN e.name LIKE 'bprof/gc.gen%' THEN 0
             WHEN e.name LIKE 'enumerate(DataLoader)#%' OR lower(e.name) LIKE '%dataloader%' THEN 1
             WHEN t.tid IS NULL THEN NULL
             WHEN e.name IN ('cudaStreamSynchronize', 'cudaDeviceSynchronize', 'cudaEventSynchronize',
                             'hipStreamSynchronize', 'hipDeviceSynchronize', 'hipEventSynchronize',
                             'aten::item', 'aten::_local_scalar_dense') THEN 2
             WHEN e.kind IN ('cpu_op', 'cuda_runtime', 'cuda_driver') THEN 3
        END AS cls
    FROM events e LEFT JOIN _idle_threads t ON t.rank = e.rank AND t.tid = e.tid
    WHERE e.run_id = $run_id AND e.kind IN ('cpu_op', 'user_annotation', 'cuda_runtime', 'cuda_driver') AND e.dur_ns > 0
      AND e.name NOT LIKE 'ProfilerStep#%'  -- a cpu_op in 2021 traces: it would hold every gap
), in_gap AS (
    -- Only intervals that overlap a gap matter, and of those only the outermost of each class on a
    -- thread. A rank's gaps are disjoint, so the gap starting last before an interval ends is the
    -- only candidate that can tell whether it overlaps any (an earlier one ends earlier still).
    SELECT ev.* FROM ev ASOF JOIN gaps g ON g.rank = ev.rank AND ev.end_ns > g.ts_ns
    WHERE ev.cls IS NOT NULL AND ev.ts_ns < g.end_ns
    QUALIFY coalesce(max(ev.end_ns) OVER (PARTITION BY ev.rank, ev.tid, ev.cls ORDER BY ev.ts_ns, ev.end_ns DESC
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), -1) < ev.end_ns
), in_span AS (
    SELECT s.rank, s.step, ev.cls, greatest(ev.ts_ns, s.ts_ns) AS ts_ns, least(ev.end_ns, s.end_ns) AS end_ns
    FROM in_gap ev JOIN spans s ON s.rank = ev.rank AND ev.ts_ns < s.end_ns AND ev.end_ns > s.ts_ns
)
SELECT {'rank': rank, 'step': step} AS key, cls, ts_ns, end_ns FROM in_span
UNION ALL
SELECT {'rank': rank, 'step': step}, 7, ts_ns, end_ns FROM gaps;

-- Algorithm: one sweep per step (iv_segments); the segments inside gaps are tied to their gap by
-- an ASOF join on the gap start; a gap is sync-caused when its first segment has the sync bit, or
-- when it starts where a sync-caused gap of the previous step ends (a gap cut by the boundary).
CREATE OR REPLACE TEMP TABLE _idle_seg AS
WITH seg AS (
    SELECT key.rank AS rank, key.step AS step, ts_ns, end_ns, mask FROM iv_segments('_idle_iv') WHERE mask & 128 > 0
), gaps AS (
    SELECT rank, step, ts_ns AS gap_ts_ns FROM breakdown_idle_gaps WHERE run_id = $run_id AND dur_ns > 0
), tied AS (
    SELECT s.*, g.gap_ts_ns FROM seg s ASOF JOIN gaps g ON s.rank = g.rank AND s.step = g.step AND s.ts_ns >= g.gap_ts_ns
), own AS (
    SELECT rank, step, gap_ts_ns, max(end_ns) AS gap_end_ns, bool_or(mask & 4 > 0 AND ts_ns = gap_ts_ns) AS sync_caused
    FROM tied GROUP BY ALL
), caused AS (
    -- a gap cut by a step boundary continues the previous step's last gap
    SELECT rank, step, gap_ts_ns,
        sync_caused OR coalesce(lag(sync_caused) OVER w AND lag(gap_end_ns) OVER w = gap_ts_ns, false) AS sync_caused
    FROM own WINDOW w AS (PARTITION BY rank ORDER BY gap_ts_ns)
)
SELECT t.rank, t.step, t.gap_ts_ns, t.ts_ns, t.end_ns, c.sync_caused,
    CASE WHEN t.mask & 1 > 0 THEN 'gc' WHEN t.mask & 2 > 0 THEN 'data_loading'
         WHEN c.sync_caused OR t.mask & 4 > 0 THEN 'sync'
         WHEN t.mask & 8 > 0 THEN 'launch_bound' ELSE 'host_other' END AS cause
FROM tied t JOIN caused c USING (rank, step, gap_ts_ns);

-- adjacent pieces of one cause in one gap merged (gaps and islands over the ordered pieces)
INSERT INTO idle_segments
WITH ordered AS (
    SELECT *, CASE WHEN lag(end_ns) OVER w = ts_ns AND lag(cause) OVER w = cause THEN 0 ELSE 1 END AS starts
    FROM _idle_seg WINDOW w AS (PARTITION BY rank, step, gap_ts_ns ORDER BY ts_ns)
), islands AS (
    SELECT *, sum(starts) OVER (PARTITION BY rank, step, gap_ts_ns ORDER BY ts_ns ROWS UNBOUNDED PRECEDING) AS island
    FROM ordered
)
SELECT $run_id, rank, step, min(ts_ns), CAST(max(end_ns) - min(ts_ns) AS BIGINT), cause
FROM islands GROUP BY rank, step, gap_ts_ns, island, cause;

INSERT INTO idle_causes
SELECT $run_id, rank, step, cause, CAST(sum(end_ns - ts_ns) AS BIGINT), count(DISTINCT gap_ts_ns)
FROM _idle_seg GROUP BY rank, step, cause;

INSERT INTO idle_gaps
WITH per_cause AS (
    SELECT rank, step, gap_ts_ns, cause, any_value(sync_caused) AS sync_caused, sum(end_ns - ts_ns) AS cause_ns
    FROM _idle_seg GROUP BY ALL
)
SELECT $run_id, p.rank, p.step, p.gap_ts_ns, g.dur_ns, p.sync_caused, p.cause, CAST(p.cause_ns AS BIGINT)
FROM per_cause p JOIN breakdown_idle_gaps g ON g.run_id = $run_id AND g.rank = p.rank AND g.step = p.step AND g.ts_ns = p.gap_ts_ns
QUALIFY row_number() OVER (PARTITION BY p.rank, p.step, p.gap_ts_ns ORDER BY p.cause_ns DESC,
    list_position(['gc', 'data_loading', 'sync', 'launch_bound', 'host_other'], p.cause)) = 1;

-- Algorithm: top-level host operators (not inside another operator on their thread: the running
-- maximum end of earlier operators is not past their start) never overlap on one thread, so each
-- segment finds the operator it may lie in by an ASOF join per host thread; segment boundaries
-- include every operator boundary, so a segment is either inside that operator or outside it.
INSERT INTO idle_ops
WITH ops AS (
    SELECT e.rank, e.tid, e.name, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns,
        max(e.ts_ns + e.dur_ns) OVER (PARTITION BY e.rank, e.tid ORDER BY e.ts_ns, e.dur_ns DESC
                                      ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
    FROM events e JOIN _idle_threads t ON t.rank = e.rank AND t.tid = e.tid
    WHERE e.run_id = $run_id AND e.kind = 'cpu_op' AND e.dur_ns > 0 AND e.name NOT LIKE 'ProfilerStep#%'
), top_ops AS (
    SELECT rank, tid, name, ts_ns, end_ns FROM ops WHERE prev_end_ns IS NULL OR prev_end_ns <= ts_ns
), seg AS (
    SELECT s.*, t.tid FROM _idle_seg s JOIN _idle_threads t USING (rank)
), inside AS (
    SELECT seg.rank, seg.cause, o.name, seg.gap_ts_ns, seg.end_ns - seg.ts_ns AS dur_ns
    FROM seg ASOF JOIN top_ops o ON o.rank = seg.rank AND o.tid = seg.tid AND o.ts_ns <= seg.ts_ns
    WHERE seg.ts_ns < o.end_ns
)
SELECT $run_id, rank, cause, name, CAST(sum(dur_ns) AS BIGINT), count(DISTINCT gap_ts_ns)
FROM inside GROUP BY rank, cause, name
QUALIFY row_number() OVER (PARTITION BY rank, cause ORDER BY sum(dur_ns) DESC, name) <= $top_n;
