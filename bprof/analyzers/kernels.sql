-- What does the device spend its time on, kernel class by kernel class, and how many FLOPs did the
-- step execute? Reads events, timeline_spans and the temp tables _classes (catalogue classes per
-- (name, kind)) and _kn_costs (FLOPs and bytes per distinct op signature, from bprof.kernels.costs,
-- built by kernels.py); writes kernels_classes, kernels_top, kernels_ops and kernels_flops.
-- GPU traces count device activity (kernels, memcpy, memset). CPU traces count each op's self time
-- (its duration minus the ops nested in it), so nested wrappers are not counted twice; only
-- namespaced ops (aten::, c10d::, ...) count, not Python autograd functions.

CREATE TABLE IF NOT EXISTS kernels_classes (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, fine_class VARCHAR NOT NULL,
    num_events BIGINT NOT NULL, num_graph_kernels BIGINT NOT NULL, dur_ns BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step, fine_class)
);
COMMENT ON TABLE kernels_classes IS 'Device time per kernel class (GPU), or op self time per class (CPU), per rank and step.';
COMMENT ON COLUMN kernels_classes.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN kernels_classes.rank IS 'Global rank.';
COMMENT ON COLUMN kernels_classes.step IS 'Profiler step (-1: outside steps or whole trace).';
COMMENT ON COLUMN kernels_classes.fine_class IS 'Catalogue class: gemm, attention, norm, elementwise, reduction, optimizer, embedding, quantize, communication, memcpy, memset, sync or unknown.';
COMMENT ON COLUMN kernels_classes.num_events IS 'Kernels (or CPU ops) of the class.';
COMMENT ON COLUMN kernels_classes.num_graph_kernels IS 'Of those, kernels launched by a CUDA graph (cudaGraphLaunch): attributed to the graph launch, counted even without shapes.';
COMMENT ON COLUMN kernels_classes.dur_ns IS 'GPU: sum of their durations (streams running at once each count); CPU: sum of the ops'' self time (nested ops excluded).';

CREATE TABLE IF NOT EXISTS kernels_top (
    run_id INTEGER NOT NULL, name VARCHAR NOT NULL, kind VARCHAR NOT NULL, fine_class VARCHAR NOT NULL,
    num_calls BIGINT NOT NULL, num_ranks INTEGER NOT NULL, dur_ns BIGINT NOT NULL, mean_dur_ns BIGINT NOT NULL,
    share_frac DOUBLE NOT NULL
);
COMMENT ON TABLE kernels_top IS 'The kernels (GPU) or CPU ops (by self time) with the most time over the run, all ranks and steps.';
COMMENT ON COLUMN kernels_top.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN kernels_top.name IS 'Kernel or op name as traced (untrusted text).';
COMMENT ON COLUMN kernels_top.kind IS 'events.kind of the rows (kernel, gpu_memcpy, gpu_memset, cpu_op).';
COMMENT ON COLUMN kernels_top.fine_class IS 'Catalogue class.';
COMMENT ON COLUMN kernels_top.num_calls IS 'Occurrences in analysed steps, all ranks.';
COMMENT ON COLUMN kernels_top.num_ranks IS 'Ranks it ran on.';
COMMENT ON COLUMN kernels_top.dur_ns IS 'Total duration.';
COMMENT ON COLUMN kernels_top.mean_dur_ns IS 'Mean duration of one call.';
COMMENT ON COLUMN kernels_top.share_frac IS 'dur_ns over the total of all kernels (or op self time) of the run.';

CREATE TABLE IF NOT EXISTS kernels_ops (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL, name VARCHAR NOT NULL,
    input_dims VARCHAR, dtype VARCHAR, fine_class VARCHAR NOT NULL, num_calls BIGINT NOT NULL,
    flops DOUBLE, bytes DOUBLE, dur_ns BIGINT NOT NULL
);
COMMENT ON TABLE kernels_ops IS 'Matmul-class ops (gemm, attention) per rank, step and shape: FLOPs and bytes from recorded shapes, and the time they took.';
COMMENT ON COLUMN kernels_ops.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN kernels_ops.rank IS 'Global rank.';
COMMENT ON COLUMN kernels_ops.step IS 'Profiler step (-1: outside steps).';
COMMENT ON COLUMN kernels_ops.name IS 'CPU op name (aten::mm, aten::addmm, ...).';
COMMENT ON COLUMN kernels_ops.input_dims IS 'Recorded Input Dims as JSON text; NULL when shapes were not recorded.';
COMMENT ON COLUMN kernels_ops.dtype IS 'Normalised matmul dtype (fp32, bf16, fp16, fp8, ...), when known.';
COMMENT ON COLUMN kernels_ops.fine_class IS 'gemm or attention.';
COMMENT ON COLUMN kernels_ops.num_calls IS 'Calls with this shape.';
COMMENT ON COLUMN kernels_ops.flops IS 'Executed FLOPs of all those calls; NULL when the cost model cannot tell (no shapes, unmodelled op).';
COMMENT ON COLUMN kernels_ops.bytes IS 'Minimum bytes moved (inputs read and output written once), all calls; NULL when unknown.';
COMMENT ON COLUMN kernels_ops.dur_ns IS 'Time of those calls: device time of the kernels they launched (GPU), or the ops'' own duration (CPU).';

CREATE TABLE IF NOT EXISTS kernels_flops (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, step INTEGER NOT NULL,
    executed_flops DOUBLE, matmul_ns BIGINT NOT NULL, matmul_known_ns BIGINT NOT NULL,
    flop_coverage_frac DOUBLE, matmul_dtype VARCHAR,
    PRIMARY KEY (run_id, rank, step)
);
COMMENT ON TABLE kernels_flops IS 'Executed FLOPs per rank and step from recorded shapes (recompute included), and how much of the matmul-class time they cover.';
COMMENT ON COLUMN kernels_flops.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN kernels_flops.rank IS 'Global rank.';
COMMENT ON COLUMN kernels_flops.step IS 'Profiler step.';
COMMENT ON COLUMN kernels_flops.executed_flops IS 'Sum of the FLOPs of matmul-class ops with known cost.';
COMMENT ON COLUMN kernels_flops.matmul_ns IS 'Time of all matmul-class work: gemm and attention kernels (GPU) or the matmul-class FLOP-leaf ops, whole duration (CPU).';
COMMENT ON COLUMN kernels_flops.matmul_known_ns IS 'Part of matmul_ns whose FLOPs are known.';
COMMENT ON COLUMN kernels_flops.flop_coverage_frac IS 'matmul_known_ns / matmul_ns; HFU needs at least 0.9. NULL without matmul work.';
COMMENT ON COLUMN kernels_flops.matmul_dtype IS 'The dtype carrying most of the known FLOPs.';

CREATE TABLE IF NOT EXISTS kernels_roofline (
    run_id INTEGER NOT NULL, name VARCHAR NOT NULL, input_dims VARCHAR, dtype VARCHAR, num_calls BIGINT NOT NULL,
    flops DOUBLE NOT NULL, bytes DOUBLE, dur_ns BIGINT NOT NULL, achieved_flops_per_s DOUBLE NOT NULL,
    achieved_bytes_per_s DOUBLE, intensity_flops_per_byte DOUBLE, peak_flops_per_s DOUBLE, peak_bytes_per_s DOUBLE,
    bound VARCHAR, peak_frac DOUBLE
);
COMMENT ON TABLE kernels_roofline IS 'Roofline position of the matmul-class op shapes with the most time: achieved FLOP/s and bytes/s against the device peak.';
COMMENT ON COLUMN kernels_roofline.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN kernels_roofline.name IS 'CPU op name.';
COMMENT ON COLUMN kernels_roofline.input_dims IS 'Recorded Input Dims (JSON text).';
COMMENT ON COLUMN kernels_roofline.dtype IS 'Normalised matmul dtype.';
COMMENT ON COLUMN kernels_roofline.num_calls IS 'Calls of this shape, all ranks and steps.';
COMMENT ON COLUMN kernels_roofline.flops IS 'Their FLOPs.';
COMMENT ON COLUMN kernels_roofline.bytes IS 'Their minimum bytes moved.';
COMMENT ON COLUMN kernels_roofline.dur_ns IS 'Their time (device time of their kernels on GPU, op time on CPU).';
COMMENT ON COLUMN kernels_roofline.achieved_flops_per_s IS 'flops / dur.';
COMMENT ON COLUMN kernels_roofline.achieved_bytes_per_s IS 'bytes / dur.';
COMMENT ON COLUMN kernels_roofline.intensity_flops_per_byte IS 'Arithmetic intensity, flops / bytes.';
COMMENT ON COLUMN kernels_roofline.peak_flops_per_s IS 'Dense peak of one device at this dtype (NULL when unknown).';
COMMENT ON COLUMN kernels_roofline.peak_bytes_per_s IS 'Memory bandwidth of one device (NULL when unknown).';
COMMENT ON COLUMN kernels_roofline.bound IS 'compute when the intensity is above the ridge point (peak FLOP/s over bandwidth), else memory; NULL without both peaks.';
COMMENT ON COLUMN kernels_roofline.peak_frac IS 'Achieved FLOP/s over the roofline at this intensity: min(peak, intensity x bandwidth) (or the FLOP peak alone without bandwidth).';

-- Device rows (GPU) or CPU ops with their self time (CPU), with their class and step span.
-- Algorithm (self time): per thread, ops nest properly. A sweep over starts (+1) and ends (-1),
-- ends first at equal instants and longer ops first among equal starts, gives each op its depth;
-- its parent is the latest op one level up that started no later (an ASOF join); self time is its
-- duration minus its children's.
CREATE OR REPLACE TEMP TABLE _kn_rows AS
WITH spans AS (
    SELECT rank, step, ts_ns, ts_ns + dur_ns AS end_ns, timeline FROM timeline_spans WHERE run_id = $run_id
), graph AS (
    SELECT DISTINCT rank, correlation FROM events
    WHERE run_id = $run_id AND kind IN ('cuda_runtime', 'cuda_driver') AND name IN ('cudaGraphLaunch', 'cudaGraphLaunch_v10000', 'hipGraphLaunch')
), dev AS (
    SELECT e.rank, e.ts_ns, e.dur_ns, e.name, e.kind, e.correlation, e.tid, g.correlation IS NOT NULL AS from_graph
    FROM events e LEFT JOIN graph g ON g.rank = e.rank AND g.correlation = e.correlation
    WHERE e.run_id = $run_id AND e.kind IN ('kernel', 'gpu_memcpy', 'gpu_memset')
      AND e.rank IN (SELECT rank FROM spans WHERE timeline = 'device')
), ops AS (
    SELECT row_number() OVER () AS id, rank, tid, ts_ns, dur_ns, name, kind
    FROM events WHERE run_id = $run_id AND kind = 'cpu_op' AND dur_ns > 0
      AND rank IN (SELECT rank FROM spans WHERE timeline = 'main_thread')
), pts AS (
    SELECT rank, tid, ts_ns AS t, 1 AS ord, dur_ns, 1 AS d, id FROM ops
    UNION ALL
    SELECT rank, tid, ts_ns + dur_ns, 0, 0, -1, NULL FROM ops
), depth AS (
    SELECT id, sum(d) OVER (PARTITION BY rank, tid ORDER BY t, ord, dur_ns DESC ROWS UNBOUNDED PRECEDING) - 1 AS depth
    FROM pts
), nested AS (
    SELECT o.*, depth.depth FROM ops o JOIN depth USING (id)
), parent AS (
    SELECT c.id, p.id AS parent_id, c.dur_ns
    FROM nested c ASOF JOIN nested p
      ON p.rank = c.rank AND p.tid = c.tid AND p.depth = c.depth - 1 AND c.ts_ns >= p.ts_ns
    WHERE c.depth > 0
), cpu AS (
    SELECT n.rank, n.ts_ns, n.dur_ns - coalesce(ch.children_ns, 0) AS dur_ns, n.name, n.kind,
        NULL::BIGINT AS correlation, n.tid, false AS from_graph
    FROM nested n
    LEFT JOIN (SELECT parent_id, sum(dur_ns) AS children_ns FROM parent GROUP BY parent_id) ch ON ch.parent_id = n.id
)
SELECT r.*, coalesce(c.fine_class, 'unknown') AS fine_class, s.step
-- CPU ops without a namespace are Python autograd functions and wrappers: their self time is a
-- wait or Python, which the breakdown and idle analyses account for; they are no kernel
FROM (SELECT * FROM dev UNION ALL SELECT * FROM cpu WHERE name LIKE '%::%') r
JOIN spans s ON s.rank = r.rank AND r.ts_ns >= s.ts_ns AND r.ts_ns < s.end_ns
LEFT JOIN _classes c ON c.name = r.name AND c.kind = r.kind;

INSERT INTO kernels_classes
SELECT $run_id, rank, step, fine_class, count(*), count(*) FILTER (WHERE from_graph), sum(dur_ns)
FROM _kn_rows GROUP BY rank, step, fine_class;

INSERT INTO kernels_top
WITH per AS (
    SELECT name, kind, any_value(fine_class) AS fine_class, count(*) AS num_calls,
        count(DISTINCT rank) AS num_ranks, sum(dur_ns) AS dur_ns
    FROM _kn_rows GROUP BY name, kind
)
SELECT $run_id, name, kind, fine_class, num_calls, num_ranks, dur_ns, CAST(dur_ns / num_calls AS BIGINT),
    dur_ns / nullif(sum(dur_ns) OVER (), 0)
FROM per ORDER BY dur_ns DESC LIMIT $top_n;

-- Matmul-class CPU ops with their signature and cost; on GPU traces, the device time of the kernels
-- each launched. Algorithm (GPU): a launch (runtime call) belongs to the innermost matmul-class op
-- around it on its thread, by time (works for every trace generation; External ids differ between
-- them); its kernels are the device rows with its correlation id.
CREATE OR REPLACE TEMP TABLE _kn_mm AS
WITH ops AS (
    SELECT e.rank, e.tid, e.ts_ns, e.dur_ns, e.name, e.step,
        CAST(e.args -> '$."Input Dims"' AS VARCHAR) AS dims, CAST(e.args -> '$."Input type"' AS VARCHAR) AS types,
        CAST(e.args -> '$."Concrete Inputs"' AS VARCHAR) AS concrete,
        row_number() OVER () AS op_id
    FROM events e WHERE e.run_id = $run_id AND e.kind = 'cpu_op' AND e.name IN (SELECT unnest($matmul_ops))
), launches AS (
    SELECT arg_max(o.op_id, o.ts_ns) AS op_id, r.rank, r.correlation
    FROM events r JOIN ops o ON o.rank = r.rank AND o.tid = r.tid AND r.ts_ns >= o.ts_ns AND r.ts_ns < o.ts_ns + o.dur_ns
    WHERE r.run_id = $run_id AND r.kind IN ('cuda_runtime', 'cuda_driver') AND r.correlation IS NOT NULL
    GROUP BY r.rank, r.correlation
), device AS (
    SELECT l.op_id, sum(k.dur_ns) AS device_ns
    FROM launches l JOIN _kn_rows k ON k.rank = l.rank AND k.correlation = l.correlation
    WHERE k.kind = 'kernel'
    GROUP BY l.op_id
), timeline AS (
    SELECT DISTINCT rank, timeline FROM timeline_spans WHERE run_id = $run_id
)
SELECT o.*, c.flops, c.bytes, c.dtype, c.fine_class,
    CASE WHEN t.timeline = 'device' THEN coalesce(d.device_ns, 0) ELSE o.dur_ns END AS work_ns,
    c.leaf
FROM ops o
JOIN timeline t USING (rank)
LEFT JOIN device d USING (op_id)
LEFT JOIN _kn_costs c ON c.name = o.name AND c.dims IS NOT DISTINCT FROM o.dims
     AND c.types IS NOT DISTINCT FROM o.types AND c.concrete IS NOT DISTINCT FROM o.concrete;

INSERT INTO kernels_ops
SELECT $run_id, rank, coalesce(step, -1), name, dims, dtype, coalesce(fine_class, 'gemm'), count(*),
    sum(flops), sum(bytes), sum(work_ns)
FROM _kn_mm WHERE leaf
GROUP BY rank, coalesce(step, -1), name, dims, dtype, coalesce(fine_class, 'gemm');

-- Coverage: GPU - device time of gemm/attention kernels vs the part launched by a leaf op of known
-- cost; CPU - the whole duration of leaf matmul-class ops vs that of those with known cost.
INSERT INTO kernels_flops
WITH matmul AS (
    SELECT rank, step, sum(dur_ns) AS matmul_ns FROM _kn_rows
    WHERE kind = 'kernel' AND fine_class IN ('gemm', 'attention') GROUP BY rank, step
    UNION ALL
    SELECT rank, coalesce(step, -1), sum(work_ns) FROM _kn_mm
    WHERE leaf AND rank IN (SELECT rank FROM timeline_spans WHERE run_id = $run_id AND timeline = 'main_thread')
    GROUP BY rank, coalesce(step, -1)
), by_dtype AS (
    SELECT rank, coalesce(step, -1) AS step, dtype, sum(flops) AS flops, sum(work_ns) AS known_ns
    FROM _kn_mm WHERE leaf AND flops IS NOT NULL GROUP BY ALL
), known AS (
    SELECT rank, step, sum(flops) AS flops, sum(known_ns) AS known_ns, arg_max(dtype, flops) AS dtype
    FROM by_dtype GROUP BY rank, step
), spans AS (
    -- reduced ranks (`bprof reduce` output) have no events: no FLOPs row rather than a zero
    SELECT rank, step FROM timeline_spans WHERE run_id = $run_id AND rank NOT IN (SELECT rank FROM reduced_ranks WHERE run_id = $run_id)
)
SELECT $run_id, s.rank, s.step, k.flops, CAST(coalesce(m.matmul_ns, 0) AS BIGINT),
    CAST(least(coalesce(k.known_ns, 0), coalesce(m.matmul_ns, 0)) AS BIGINT),
    CASE WHEN m.matmul_ns > 0 THEN least(coalesce(k.known_ns, 0) / m.matmul_ns, 1.0) END,
    k.dtype
FROM spans s LEFT JOIN matmul m USING (rank, step) LEFT JOIN known k USING (rank, step);
