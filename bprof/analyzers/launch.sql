-- How fast does the host feed the device? Per rank and step: kernels, launch latency, tiny kernels
-- and the idle gaps between them (what CUDA graphs or torch.compile would remove), CUDA graphs.
-- Reads timeline_spans, breakdown_idle_gaps, events; writes launch_steps and launch_tiny_kernels.
--
-- Definitions:
-- * A launch is a CUDA/HIP runtime or driver call whose correlation id some device op (kernel,
--   memcpy, memset) carries: NCCL >= 2.27 and Triton launch through the driver API
--   (cuLaunchKernelEx, cuLaunchKernel); one launch per correlation id, the earliest call holding
--   it (a driver call nested in a runtime call with the same id is the same launch). A graph launch ($graph_launch_names, from
--   bprof.kernels.classify.is_graph_launch) shares its correlation with every kernel it replays.
-- * Launch latency = start of the first kernel of a launch - start of the launch call, per kernel
--   launch. Small latencies mean the device waits for each launch; large ones mean the host runs
--   ahead and kernels queue.
-- * A tiny kernel runs less than $tiny_ns (10 µs): its launch costs about as much as it runs.
-- * A tiny gap is an idle gap of the device (breakdown_idle_gaps) between two tiny kernels: the op
--   that ends where the gap starts and the op that starts where it ends are both tiny kernels.
-- * Kernels belong to the step whose span holds their start; launches to the step of their call.

CREATE TABLE IF NOT EXISTS launch_steps (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL,
    num_kernels BIGINT NOT NULL, kernel_ns BIGINT NOT NULL, num_launches BIGINT NOT NULL,
    median_launch_latency_ns BIGINT, p95_launch_latency_ns BIGINT,
    num_tiny_kernels BIGINT NOT NULL, tiny_kernel_ns BIGINT NOT NULL,
    num_tiny_gaps BIGINT NOT NULL, tiny_gap_ns BIGINT NOT NULL,
    num_graph_launches BIGINT NOT NULL, num_graph_kernels BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step)
);
COMMENT ON TABLE launch_steps IS 'Kernel launch statistics per rank and step (GPU traces only).';
COMMENT ON COLUMN launch_steps.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN launch_steps.rank IS 'Global rank.';
COMMENT ON COLUMN launch_steps.step IS 'Profiler step (-1: whole trace).';
COMMENT ON COLUMN launch_steps.num_kernels IS 'Kernels starting in the step span.';
COMMENT ON COLUMN launch_steps.kernel_ns IS 'Sum of their durations (streams overlapping count twice).';
COMMENT ON COLUMN launch_steps.num_launches IS 'Runtime/driver calls in the step that launched device ops (kernels, memcpy, memset).';
COMMENT ON COLUMN launch_steps.median_launch_latency_ns IS 'Median over kernel launches of first kernel start - launch call start; NULL without kernel launches.';
COMMENT ON COLUMN launch_steps.p95_launch_latency_ns IS '95th percentile (nearest rank) of the same latencies.';
COMMENT ON COLUMN launch_steps.num_tiny_kernels IS 'Kernels shorter than 10 µs.';
COMMENT ON COLUMN launch_steps.tiny_kernel_ns IS 'Sum of the tiny kernels'' durations.';
COMMENT ON COLUMN launch_steps.num_tiny_gaps IS 'Device idle gaps between two tiny kernels.';
COMMENT ON COLUMN launch_steps.tiny_gap_ns IS 'Their total length: the idle time a fused or graph-captured sequence would not have.';
COMMENT ON COLUMN launch_steps.num_graph_launches IS 'CUDA/HIP graph launches (cudaGraphLaunch ...) in the step.';
COMMENT ON COLUMN launch_steps.num_graph_kernels IS 'Kernels replayed by those graph launches (they share the launch''s correlation id).';

CREATE TABLE IF NOT EXISTS launch_tiny_kernels (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, name VARCHAR NOT NULL,
    num_kernels BIGINT NOT NULL, dur_ns BIGINT NOT NULL, num_tiny_gaps_after BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, name)
);
COMMENT ON TABLE launch_tiny_kernels IS 'The most frequent tiny kernels per rank (top N by count, all analysed steps).';
COMMENT ON COLUMN launch_tiny_kernels.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN launch_tiny_kernels.rank IS 'Global rank.';
COMMENT ON COLUMN launch_tiny_kernels.name IS 'Kernel name.';
COMMENT ON COLUMN launch_tiny_kernels.num_kernels IS 'Tiny runs of this kernel.';
COMMENT ON COLUMN launch_tiny_kernels.dur_ns IS 'Their total duration.';
COMMENT ON COLUMN launch_tiny_kernels.num_tiny_gaps_after IS 'Tiny gaps that follow a run of this kernel.';

CREATE OR REPLACE TEMP TABLE _launch_dev AS
SELECT e.rank, s.step, e.kind, e.name, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns, e.dur_ns, e.correlation,
    e.kind = 'kernel' AND e.dur_ns < $tiny_ns AS tiny
FROM events e JOIN timeline_spans s ON s.run_id = e.run_id AND s.rank = e.rank
     AND e.ts_ns >= s.ts_ns AND e.ts_ns < s.ts_ns + s.dur_ns
WHERE e.run_id = $run_id AND e.kind IN ('kernel', 'gpu_memcpy', 'gpu_memset');

CREATE OR REPLACE TEMP TABLE _launch_calls AS
WITH calls AS (
    SELECT e.rank, s.step, e.name, e.ts_ns, e.correlation, list_contains($graph_launch_names, e.name) AS is_graph
    FROM events e JOIN timeline_spans s ON s.run_id = e.run_id AND s.rank = e.rank
         AND e.ts_ns >= s.ts_ns AND e.ts_ns < s.ts_ns + s.dur_ns
    WHERE e.run_id = $run_id AND e.kind IN ('cuda_runtime', 'cuda_driver') AND e.correlation IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY e.rank, e.correlation ORDER BY e.ts_ns, e.kind DESC) = 1
), targets AS (
    SELECT e.rank, e.correlation, min(e.ts_ns) FILTER (WHERE e.kind = 'kernel') AS first_kernel_ts_ns,
        count(*) FILTER (WHERE e.kind = 'kernel') AS num_kernels
    FROM events e
    WHERE e.run_id = $run_id AND e.kind IN ('kernel', 'gpu_memcpy', 'gpu_memset') AND e.correlation IS NOT NULL
    GROUP BY ALL
)
SELECT c.*, t.first_kernel_ts_ns - c.ts_ns AS latency_ns, t.num_kernels
FROM calls c JOIN targets t USING (rank, correlation);

-- Algorithm: the op before a gap is the device op with the latest end at or before the gap start
-- (ASOF on end), the op after it the one with the earliest start at or after the gap end (ASOF on
-- start); both are looked up among all the rank's device ops, whatever their step.
CREATE OR REPLACE TEMP TABLE _launch_tiny_gaps AS
WITH gaps AS (
    SELECT rank, step, ts_ns, ts_ns + dur_ns AS end_ns, dur_ns FROM breakdown_idle_gaps WHERE run_id = $run_id
), before AS (
    SELECT g.*, d.name AS before_name, d.tiny AS before_tiny, d.end_ns AS before_end_ns
    FROM gaps g ASOF JOIN _launch_dev d ON d.rank = g.rank AND g.ts_ns >= d.end_ns
), after AS (
    SELECT b.*, d.tiny AS after_tiny, d.ts_ns AS after_ts_ns
    FROM before b ASOF JOIN _launch_dev d ON d.rank = b.rank AND b.end_ns <= d.ts_ns
)
SELECT rank, step, ts_ns, dur_ns, before_name FROM after
WHERE before_tiny AND after_tiny AND before_end_ns = ts_ns AND after_ts_ns = end_ns;

INSERT INTO launch_steps
WITH k AS (
    SELECT rank, step, count(*) FILTER (WHERE kind = 'kernel') AS num_kernels,
        coalesce(sum(dur_ns) FILTER (WHERE kind = 'kernel'), 0) AS kernel_ns,
        count(*) FILTER (WHERE tiny) AS num_tiny, coalesce(sum(dur_ns) FILTER (WHERE tiny), 0) AS tiny_ns
    FROM _launch_dev GROUP BY rank, step
), l AS (
    SELECT rank, step, count(*) AS num_launches,
        median(latency_ns) FILTER (WHERE latency_ns IS NOT NULL) AS med_ns,
        quantile_disc(latency_ns, 0.95) FILTER (WHERE latency_ns IS NOT NULL) AS p95_ns,
        count(*) FILTER (WHERE is_graph) AS num_graph_launches,
        coalesce(sum(num_kernels) FILTER (WHERE is_graph), 0) AS num_graph_kernels
    FROM _launch_calls GROUP BY rank, step
), g AS (
    SELECT rank, step, count(*) AS num_gaps, sum(dur_ns) AS gap_ns FROM _launch_tiny_gaps GROUP BY rank, step
)
SELECT $run_id, s.rank, s.step, coalesce(k.num_kernels, 0), CAST(coalesce(k.kernel_ns, 0) AS BIGINT),
    coalesce(l.num_launches, 0), CAST(l.med_ns AS BIGINT), CAST(l.p95_ns AS BIGINT),
    coalesce(k.num_tiny, 0), CAST(coalesce(k.tiny_ns, 0) AS BIGINT),
    coalesce(g.num_gaps, 0), CAST(coalesce(g.gap_ns, 0) AS BIGINT),
    coalesce(l.num_graph_launches, 0), CAST(coalesce(l.num_graph_kernels, 0) AS BIGINT)
FROM timeline_spans s
LEFT JOIN k USING (rank, step) LEFT JOIN l USING (rank, step) LEFT JOIN g USING (rank, step)
-- reduced ranks (`bprof reduce` output) have no events: no row rather than zeros
WHERE s.run_id = $run_id AND s.timeline = 'device' AND s.rank NOT IN (SELECT rank FROM reduced_ranks WHERE run_id = $run_id);

INSERT INTO launch_tiny_kernels
WITH t AS (
    SELECT rank, name, count(*) AS num_kernels, sum(dur_ns) AS dur_ns FROM _launch_dev WHERE tiny GROUP BY rank, name
), g AS (
    SELECT rank, before_name AS name, count(*) AS num_gaps FROM _launch_tiny_gaps GROUP BY rank, name
)
SELECT $run_id, t.rank, t.name, t.num_kernels, CAST(t.dur_ns AS BIGINT), coalesce(g.num_gaps, 0)
FROM t LEFT JOIN g USING (rank, name)
QUALIFY row_number() OVER (PARTITION BY t.rank ORDER BY t.num_kernels DESC, t.name) <= $top_n;
