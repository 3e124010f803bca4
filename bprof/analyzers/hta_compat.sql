-- What would HolisticTraceAnalysis 0.5.0 report for each rank? Its get_temporal_breakdown (idle /
-- compute / non-compute fractions) and get_comm_comp_overlap, computed from the store with HTA's
-- own definitions, so that `benchmarks/hta_parity.py` can check bprof against HTA. Parity checks
-- only (`bprof analyze --hta-compat`): bprof's own numbers are breakdown.sql's.
-- Reads events and ranks; writes hta_compat_ranks.
--
-- HTA 0.5.0's definitions (hta/common/trace_parser.py, trace.py, utils/utils.py,
-- analyzers/breakdown_analysis.py, communication_analysis.py), reproduced here:
-- * Clock: float-µs timestamps are rounded inward to whole µs: ts -> ceil(ts), end -> floor(ts +
--   dur), on the file's own ts values (relative to baseTimeNanoseconds in modern traces). Whole-µs
--   traces are unchanged.
-- * Events: every complete event (dur and cat present, cat <> 'Trace') whose args.stream converts
--   to an integer other than -1: kernels, memcpys and memsets on all streams. The rest (args.stream
--   missing, or '0x0' as ROCm runtime calls write it) stands for the CPU.
-- * Last-step filter: when the trace folder holds more than one distinct ProfilerStep name, a
--   rank keeps only its CPU events that start before its last ProfilerStep starts, and only the GPU
--   events (args.stream >= 0 and args.correlation >= 0) whose correlation one of those CPU events
--   carries: kernels launched in the last step, or before profiling started, are dropped.
-- * Window: from the first start to the last end of the events kept (kernel_time).
-- * Classes, by kernel name only: communication = ^nccl.*Kernel (old ncclKernel_* and newer
--   ncclDevKernel_* alike); memory = ^Memcpy|^Memset|^dma; computation = anything that is neither
--   nor contains Memcpy or Sync; the rest (e.g. a name containing Sync) is "other".
-- * idle = window - |union of all events|; compute = |union of computation|; non-compute =
--   window - compute - idle (communication, memory and other, where no computation runs).
-- * comm_overlap = |union(communication) ∩ union(computation)| / |union(communication)|
--   (HTA returns it only as a percentage rounded to 2 digits).
--
-- Deliberate differences between this mode and bprof's own breakdown (breakdown.sql):
-- * Window: bprof partitions per-step spans (ProfilerStep start to next step start, the last step
--   to its last device activity) and keeps the last step; HTA measures one window from the first to
--   the last GPU event kept, drops the last step's kernels, and counts time before the first step.
--   A step is what a fix shortens, so bprof measures steps.
-- * Classes: bprof uses its kernel catalogue's coarse classes (bprof.kernels). They agree with
--   HTA on NCCL/RCCL kernels (ncclKernel_*, ncclDevKernel_*), Memcpy and Memset; they differ where
--   HTA's name rule does not know a kernel: peer copies (Memcpy PtoP: communication in bprof,
--   memory in HTA), symmetric-memory, NVSHMEM, DeepEP and TransformerEngine userbuffers
--   collectives (communication in bprof, computation in HTA), and CUDA sync activity recorded on a
--   stream (bprof's sync class; HTA: "other" when the name contains Sync, so Stream Sync, but
--   computation for Stream Wait Event). Here HTA's rules are used as they are: this mode exists to
--   reproduce HTA's numbers, and a catalogue rule would make that depend on the catalogue.
-- * Clock: bprof keeps nanoseconds on the rank's own clock; HTA's inward µs rounding shortens
--   every event by up to 2 µs (events shorter than 1 µs can vanish).
-- Not reproduced: an event shorter than 1 µs that contains no whole µs gets end < ts after
-- rounding; HTA's interval merge then counts it as negative time when it starts a merged interval
-- of its own (in an order its unstable sort decides). Here it counts as empty (at most 1 µs per
-- such event; none occur in ../shared/traces).

CREATE TABLE IF NOT EXISTS hta_compat_ranks (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL,
    window_ts_ns BIGINT NOT NULL, window_dur_ns BIGINT NOT NULL,
    idle_ns BIGINT NOT NULL, compute_ns BIGINT NOT NULL, non_compute_ns BIGINT NOT NULL,
    comm_ns BIGINT NOT NULL, comm_overlap_ns BIGINT NOT NULL,
    idle_frac DOUBLE NOT NULL, compute_frac DOUBLE NOT NULL, non_compute_frac DOUBLE NOT NULL,
    comm_overlap_frac DOUBLE,
    num_events BIGINT NOT NULL, last_step_dropped BOOLEAN NOT NULL,
    PRIMARY KEY (run_id, rank)
);
COMMENT ON TABLE hta_compat_ranks IS 'What HolisticTraceAnalysis 0.5.0 reports per rank (get_temporal_breakdown, get_comm_comp_overlap), with its definitions and window (hta_compat.sql); for parity checks, not bprof''s own breakdown.';
COMMENT ON COLUMN hta_compat_ranks.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN hta_compat_ranks.rank IS 'Global rank.';
COMMENT ON COLUMN hta_compat_ranks.window_ts_ns IS 'Start of HTA''s window: the first kept GPU event''s start, rounded up to a whole µs as HTA rounds it, own clock.';
COMMENT ON COLUMN hta_compat_ranks.window_dur_ns IS 'HTA''s kernel_time: first kept GPU event start to last kept GPU event end, whole µs.';
COMMENT ON COLUMN hta_compat_ranks.idle_ns IS 'Time in the window with no kept GPU event running.';
COMMENT ON COLUMN hta_compat_ranks.compute_ns IS 'Time a computation kernel (HTA''s name rule) runs.';
COMMENT ON COLUMN hta_compat_ranks.non_compute_ns IS 'window_dur_ns - compute_ns - idle_ns: communication, memory and other events with no computation running.';
COMMENT ON COLUMN hta_compat_ranks.comm_ns IS 'Time a communication kernel (^nccl.*Kernel) runs.';
COMMENT ON COLUMN hta_compat_ranks.comm_overlap_ns IS 'Time communication and computation kernels run together.';
COMMENT ON COLUMN hta_compat_ranks.idle_frac IS 'idle_ns / window_dur_ns (HTA idle_time_pctg / 100).';
COMMENT ON COLUMN hta_compat_ranks.compute_frac IS 'compute_ns / window_dur_ns (HTA compute_time_pctg / 100).';
COMMENT ON COLUMN hta_compat_ranks.non_compute_frac IS 'non_compute_ns / window_dur_ns (HTA non_compute_time_pctg / 100).';
COMMENT ON COLUMN hta_compat_ranks.comm_overlap_frac IS 'comm_overlap_ns / comm_ns (HTA comp_comm_overlap_pctg / 100); NULL without communication kernels (HTA: NaN).';
COMMENT ON COLUMN hta_compat_ranks.num_events IS 'GPU events HTA measures on this rank (after its last-step filter).';
COMMENT ON COLUMN hta_compat_ranks.last_step_dropped IS 'Whether HTA''s last-step filter applied (the run has more than one distinct ProfilerStep name).';

-- hta_compat_us(ns): the float µs value HTA parses from the trace for an integer ns value (the
-- JSON's decimal digits, correctly rounded to a double). A double has 0.25 µs steps at absolute
-- epoch µs (~1.7e15), so HTA's rounding of ns-resolution traces depends on it.
CREATE OR REPLACE TEMP MACRO hta_compat_us(ns) AS
    CAST(CASE WHEN ns < 0 THEN '-' ELSE '' END || (abs(ns) // 1000)::VARCHAR || '.'
         || lpad((abs(ns) % 1000)::VARCHAR, 3, '0') AS DOUBLE);

-- hta_compat_stream(j): Python's int() of a JSON args value, as HTA normalises args.stream; NULL
-- where int() fails (ROCm runtime calls write stream '0x0', which int() rejects and DuckDB accepts).
CREATE OR REPLACE TEMP MACRO hta_compat_stream(j) AS
    CASE json_type(j)
        WHEN 'VARCHAR' THEN CASE WHEN regexp_full_match(j ->> '$', '\s*[+-]?[0-9]+\s*')
                                 THEN CAST(trim(j ->> '$') AS BIGINT) END
        WHEN 'DOUBLE' THEN CAST(trunc(CAST(j ->> '$' AS DOUBLE)) AS BIGINT)
        WHEN 'BOOLEAN' THEN CASE WHEN j ->> '$' = 'true' THEN 1 ELSE 0 END
        ELSE TRY_CAST(j ->> '$' AS BIGINT) END;

-- Every event HTA parses, with its µs rounding (ts -> ceil(ts), end -> floor(ts + dur), in float
-- µs on the file's own ts values), its stream and correlation (a missing value is -1) and which
-- side of its GPU/CPU filter it falls on. ts_ns/end_ns are the rounded times back on the rank's own
-- clock (base_time_ns + µs * 1000).
CREATE OR REPLACE TEMP TABLE _hta_compat_ev AS
WITH ev AS (
    SELECT e.rank, e.name, r.base_time_ns,
        hta_compat_us(e.ts_ns - r.base_time_ns) AS ts_us, hta_compat_us(e.dur_ns) AS dur_us,
        coalesce(hta_compat_stream(e.args -> '$.stream'), -1) AS stream,
        coalesce(CASE WHEN json_type(e.args -> '$.correlation') IN ('UBIGINT', 'BIGINT')
                      THEN CAST(e.args ->> '$.correlation' AS BIGINT) END, -1) AS corr
    FROM events e JOIN ranks r ON r.run_id = e.run_id AND r.rank = e.rank
    WHERE e.run_id = $run_id AND e.cat IS NOT NULL AND e.cat <> 'Trace' AND e.name IS NOT NULL
      AND e.kind NOT IN ('metadata', 'flow_start', 'flow_end', 'instant')
      -- only these can matter: a stream makes a GPU event, a correlation links it to its launch
      AND (e.args ->> '$.stream' IS NOT NULL OR e.args ->> '$.correlation' IS NOT NULL
           OR contains(e.name, 'ProfilerStep'))
)
SELECT rank, name, stream, corr,
    (stream >= 0 AND corr >= 0) OR name IN ('Event Sync', 'Context Sync') AS is_gpu,
    base_time_ns + 1000 * CAST(ceil(ts_us) AS BIGINT) AS ts_ns,
    base_time_ns + 1000 * CAST(floor(ts_us + dur_us) AS BIGINT) AS end_ns
FROM ev;

-- Algorithm: HTA's last-step filter. Its symbol table spans the trace folder (all ranks), so the
-- filter applies to every rank or to none; each rank's cut is its own last ProfilerStep start.
CREATE OR REPLACE TEMP TABLE _hta_compat_kept AS
WITH filtering AS (
    SELECT count(DISTINCT name) > 1 AS applies FROM _hta_compat_ev WHERE contains(name, 'ProfilerStep')
), last_step AS (
    SELECT rank, max(ts_ns) AS last_start_ns FROM _hta_compat_ev
    WHERE NOT is_gpu AND contains(name, 'ProfilerStep') GROUP BY rank
), cpu AS (
    SELECT e.* FROM _hta_compat_ev e JOIN last_step l USING (rank)
    WHERE NOT e.is_gpu AND e.ts_ns < l.last_start_ns
), kept AS (
    SELECT rank, name, ts_ns, end_ns FROM _hta_compat_ev WHERE NOT (SELECT applies FROM filtering) AND stream <> -1
    UNION ALL
    SELECT rank, name, ts_ns, end_ns FROM cpu WHERE (SELECT applies FROM filtering) AND stream <> -1
    UNION ALL
    SELECT g.rank, g.name, g.ts_ns, g.end_ns FROM _hta_compat_ev g
    WHERE (SELECT applies FROM filtering) AND g.is_gpu AND g.stream <> -1
      AND EXISTS (SELECT 1 FROM cpu c WHERE c.rank = g.rank AND c.corr = g.corr)
), names AS (
    SELECT name,
        CASE WHEN regexp_matches(name, '^nccl.*Kernel') THEN 'communication'
             WHEN regexp_matches(name, '^(Memcpy|Memset|dma)') THEN 'memory'
             WHEN regexp_matches(name, '^(nccl.*Kernel|.*Memcpy|Memset|.*Sync)') THEN 'other'
             ELSE 'computation' END AS kernel_type
    FROM (SELECT DISTINCT name FROM kept)
)
SELECT k.rank, k.name, n.kernel_type, k.ts_ns, k.end_ns, (SELECT applies FROM filtering) AS last_step_dropped
FROM kept k JOIN names n USING (name);

-- Interval classes for iv_coverage: 0 computation, 1 communication, 2 every kept event.
CREATE OR REPLACE TEMP TABLE _hta_compat_iv AS
SELECT rank AS key, 0 AS cls, ts_ns, end_ns FROM _hta_compat_kept WHERE kernel_type = 'computation'
UNION ALL
SELECT rank, 1, ts_ns, end_ns FROM _hta_compat_kept WHERE kernel_type = 'communication'
UNION ALL
SELECT rank, 2, ts_ns, end_ns FROM _hta_compat_kept;

INSERT INTO hta_compat_ranks
WITH win AS (
    SELECT rank, min(ts_ns) AS window_ts_ns, max(end_ns) - min(ts_ns) AS window_dur_ns,
        count(*) AS num_events, any_value(last_step_dropped) AS last_step_dropped
    FROM _hta_compat_kept GROUP BY rank
), cov AS (
    SELECT key AS rank,
        coalesce(sum(dur_ns) FILTER (WHERE mask & 4 > 0), 0) AS busy_ns,
        coalesce(sum(dur_ns) FILTER (WHERE mask & 1 > 0), 0) AS compute_ns,
        coalesce(sum(dur_ns) FILTER (WHERE mask & 2 > 0), 0) AS comm_ns,
        coalesce(sum(dur_ns) FILTER (WHERE mask & 3 = 3), 0) AS comm_overlap_ns
    FROM iv_coverage('_hta_compat_iv') GROUP BY key
), ns AS (
    SELECT w.rank, w.window_ts_ns, w.window_dur_ns, w.num_events, w.last_step_dropped,
        CAST(w.window_dur_ns - coalesce(c.busy_ns, 0) AS BIGINT) AS idle_ns,
        CAST(coalesce(c.compute_ns, 0) AS BIGINT) AS compute_ns,
        CAST(coalesce(c.busy_ns, 0) - coalesce(c.compute_ns, 0) AS BIGINT) AS non_compute_ns,
        CAST(coalesce(c.comm_ns, 0) AS BIGINT) AS comm_ns,
        CAST(coalesce(c.comm_overlap_ns, 0) AS BIGINT) AS comm_overlap_ns
    FROM win w LEFT JOIN cov c USING (rank)
    WHERE w.window_dur_ns > 0
)
SELECT $run_id, rank, window_ts_ns, window_dur_ns, idle_ns, compute_ns, non_compute_ns, comm_ns, comm_overlap_ns,
    idle_ns / window_dur_ns, compute_ns / window_dur_ns, non_compute_ns / window_dur_ns,
    CASE WHEN comm_ns > 0 THEN comm_overlap_ns / comm_ns END,
    num_events, last_step_dropped
FROM ns;
