-- Which span of time is each rank's step, and which timeline stands for its device?
-- Reads steps, events, reduced_ranks, reduced_spans; writes timeline_spans. Every other analyzer
-- partitions these spans. A reduced rank (ingested from `bprof reduce` output: no events) gets
-- the spans the reduce computed from its trace with this same query.
-- Algorithm: where the rank has a device timeline and the step launched device work, its span is
-- the step on the device (steps.device_ts_ns/device_dur_ns, made by ingest: from the end of the
-- previous step's device work to the end of this step's), so the step time is the device's even
-- when the host runs ahead and the device's queue grows (issue 21: CPU steps of 16 ms launching
-- 19 ms of device work each). Otherwise (CPU traces, steps that launched nothing, stores ingested
-- before schema 9) a step's span starts at its ProfilerStep range on the CPU and ends where the
-- next consecutive step starts, so consecutive spans tile the rank's timeline with no gap and no
-- overlap; the last step (or one followed by a jump in step numbers) ends at the later of its CPU
-- range end and the end of the last device activity it launched (the device may lag the CPU).
-- The step on the host (host_ts_ns/host_dur_ns) is the CPU tiling without that extension: what
-- analyses of host time (phases) partition.
-- A rank with no ProfilerStep range gets one span, step -1, over all its device activity (or all
-- its CPU ops on CPU traces): the whole trace. Its main thread is the one with the most time in
-- outermost ops that are not backward ranges, not simply the busiest: on GPU runs the autograd
-- engine's thread runs the backward (nested ranges, often more op time than the main thread), and
-- taking it for the main thread lost every forward op of the trace.

CREATE TABLE IF NOT EXISTS timeline_spans (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    ts_ns BIGINT NOT NULL,
    dur_ns BIGINT NOT NULL,
    timeline VARCHAR NOT NULL,
    main_tid VARCHAR,
    host_ts_ns BIGINT,
    host_dur_ns BIGINT,
    device_lag_ns BIGINT,
    PRIMARY KEY (run_id, rank, step)
);
COMMENT ON TABLE timeline_spans IS 'The span of each rank''s step that analyses partition; consecutive steps tile the timeline.';
COMMENT ON COLUMN timeline_spans.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN timeline_spans.rank IS 'Global rank.';
COMMENT ON COLUMN timeline_spans.step IS 'Profiler step; -1 = the whole trace of a rank without ProfilerStep ranges.';
COMMENT ON COLUMN timeline_spans.ts_ns IS 'Span start, own clock: the step on the device (steps.device_ts_ns) where the rank''s timeline is the device and the step launched device work, else the ProfilerStep start on the CPU.';
COMMENT ON COLUMN timeline_spans.dur_ns IS 'Span length: steps.device_dur_ns for a device step; else to the next consecutive step''s start, or for the last step to the later of its CPU end and its last device activity. This is the step time.';
COMMENT ON COLUMN timeline_spans.timeline IS 'What stands for the device: device (GPU kernels, memcpy, memset on all streams) or main_thread (CPU traces: the training thread).';
COMMENT ON COLUMN timeline_spans.main_tid IS 'The training (main) thread: the thread of the ProfilerStep ranges, else the busiest CPU-op thread.';
COMMENT ON COLUMN timeline_spans.host_ts_ns IS 'Start of the step on the host: the ProfilerStep start on the CPU (step -1: ts_ns).';
COMMENT ON COLUMN timeline_spans.host_dur_ns IS 'Length of the step on the host: to the next consecutive step''s ProfilerStep start, the last step to its CPU range end (step -1: dur_ns). Host-time analyses (phases) partition this.';
COMMENT ON COLUMN timeline_spans.device_lag_ns IS 'steps.device_lag_ns: how long after its CPU range ended the device finished the step''s work (the host''s lead: a queue); NULL where the span is not a device step.';

CREATE TABLE IF NOT EXISTS timeline_threads (
    run_id INTEGER NOT NULL,
    rank INTEGER NOT NULL,
    tid VARCHAR NOT NULL,
    role VARCHAR NOT NULL,
    PRIMARY KEY (run_id, rank, tid)
);
COMMENT ON TABLE timeline_threads IS 'The host threads that drive a rank''s training: its main thread and the threads that run backward.';
COMMENT ON COLUMN timeline_threads.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN timeline_threads.rank IS 'Global rank.';
COMMENT ON COLUMN timeline_threads.tid IS 'Thread id as traced.';
COMMENT ON COLUMN timeline_threads.role IS 'main (timeline_spans.main_tid) or backward (a thread with autograd engine ranges or *Backward ops: the autograd thread of GPU runs).';

DELETE FROM timeline_spans WHERE run_id = $run_id;
DELETE FROM timeline_threads WHERE run_id = $run_id;

INSERT INTO timeline_spans
WITH dev AS (
    SELECT rank, step, max(ts_ns + dur_ns) AS last_end_ns, min(ts_ns) AS first_ts_ns
    FROM events
    WHERE run_id = $run_id AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset')
    GROUP BY ALL
), has_dev AS (
    SELECT rank, min(first_ts_ns) AS first_ts_ns, max(last_end_ns) AS last_end_ns FROM dev GROUP BY rank
), step_tid AS (
    SELECT rank, mode(tid) AS tid FROM events
    WHERE run_id = $run_id AND kind = 'user_annotation' AND name LIKE 'ProfilerStep#%'
    GROUP BY rank
), top_level AS (
    -- only ranks that lack ProfilerStep ranges or steps rows need it: which ops are outermost on their thread
    SELECT rank, tid, ts_ns, dur_ns,
        (name LIKE 'autograd::engine::evaluate_function:%' OR name LIKE '%Backward%') AS is_bwd,
        coalesce(max(ts_ns + dur_ns) OVER (PARTITION BY rank, tid ORDER BY ts_ns, dur_ns DESC
                                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), ts_ns) <= ts_ns AS outermost
    FROM events
    WHERE run_id = $run_id AND kind = 'cpu_op'
      AND (rank NOT IN (SELECT rank FROM step_tid) OR rank NOT IN (SELECT rank FROM steps WHERE run_id = $run_id))
), busiest_tid AS (
    SELECT rank, arg_max(tid, (drive_ns, busy_ns)) AS tid, min(first_ts_ns) AS first_ts_ns, max(last_end_ns) AS last_end_ns
    FROM (SELECT rank, tid, sum(CASE WHEN outermost AND NOT is_bwd THEN dur_ns ELSE 0 END) AS drive_ns,
              sum(dur_ns) AS busy_ns, min(ts_ns) AS first_ts_ns, max(ts_ns + dur_ns) AS last_end_ns
          FROM top_level GROUP BY ALL)
    GROUP BY rank
), ranks AS (
    SELECT r.rank,
        CASE WHEN h.rank IS NOT NULL THEN 'device' ELSE 'main_thread' END AS timeline,
        coalesce(s.tid, b.tid) AS main_tid,
        coalesce(h.first_ts_ns, b.first_ts_ns) AS first_ts_ns,
        coalesce(h.last_end_ns, b.last_end_ns) AS last_end_ns
    FROM ranks r
    LEFT JOIN has_dev h USING (rank)
    LEFT JOIN step_tid s USING (rank)
    LEFT JOIN busiest_tid b USING (rank)
    WHERE r.run_id = $run_id AND r.rank NOT IN (SELECT rank FROM reduced_ranks WHERE run_id = $run_id)
), stepped AS (
    SELECT s.rank, s.step, s.ts_ns, s.ts_ns + s.dur_ns AS cpu_end_ns, s.device_ts_ns, s.device_dur_ns, s.device_lag_ns,
        lead(s.step) OVER w AS next_step, lead(s.ts_ns) OVER w AS next_ts_ns
    FROM steps s WHERE s.run_id = $run_id
    WINDOW w AS (PARTITION BY s.rank ORDER BY s.step)
), cpu_spans AS (
    SELECT st.*, r.timeline, r.main_tid,
        CASE WHEN st.next_step = st.step + 1 THEN st.next_ts_ns ELSE st.cpu_end_ns END - st.ts_ns AS host_dur_ns,
        CASE WHEN st.next_step = st.step + 1 THEN st.next_ts_ns
             ELSE greatest(st.cpu_end_ns, coalesce(d.last_end_ns, st.cpu_end_ns)) END - st.ts_ns AS cpu_dur_ns,
        r.timeline = 'device' AND st.device_ts_ns IS NOT NULL AS on_device
    FROM stepped st
    JOIN ranks r USING (rank)
    LEFT JOIN dev d ON d.rank = st.rank AND d.step = st.step
)
SELECT $run_id, rank, step,
    CASE WHEN on_device THEN device_ts_ns ELSE ts_ns END,
    CASE WHEN on_device THEN device_dur_ns ELSE cpu_dur_ns END,
    timeline, main_tid, ts_ns, host_dur_ns,
    CASE WHEN on_device THEN device_lag_ns END
FROM cpu_spans
UNION ALL
SELECT $run_id, r.rank, -1, r.first_ts_ns, r.last_end_ns - r.first_ts_ns, r.timeline, r.main_tid,
    r.first_ts_ns, r.last_end_ns - r.first_ts_ns, NULL
FROM ranks r
WHERE r.first_ts_ns IS NOT NULL AND NOT EXISTS (SELECT 1 FROM steps s WHERE s.run_id = $run_id AND s.rank = r.rank)
UNION ALL
SELECT $run_id, rank, step, ts_ns, dur_ns, timeline, main_tid,
    coalesce(host_ts_ns, ts_ns), coalesce(host_dur_ns, dur_ns), device_lag_ns
FROM reduced_spans WHERE run_id = $run_id;

INSERT INTO timeline_threads
SELECT $run_id, rank, tid, 'main' FROM (SELECT DISTINCT rank, main_tid AS tid FROM timeline_spans WHERE run_id = $run_id AND main_tid IS NOT NULL)
UNION ALL
SELECT DISTINCT $run_id, e.rank, e.tid, 'backward' FROM events e
WHERE e.run_id = $run_id AND e.kind = 'cpu_op' AND e.tid IS NOT NULL
  AND (e.name LIKE 'autograd::engine::evaluate_function:%' OR e.name LIKE '%Backward%')
  AND NOT EXISTS (SELECT 1 FROM timeline_spans s WHERE s.run_id = $run_id AND s.rank = e.rank AND s.main_tid = e.tid);
