-- Pipeline bubbles: which pipeline stage is each rank, how many micro-batches does a step push
-- through the pipeline, how long does each stage wait for its neighbours per step (its bubble), how
-- does that compare with the schedule's theory, and which stage's extra work makes the others wait?
-- Reads collectives, timeline_spans, breakdown_steps, breakdown_dims, breakdown_groups, runs;
-- writes bubbles_stages and bubbles_runs. A run without send/recv calls gets no rows at all.
--
-- Definitions:
-- * Stages come from the send/recv calls of the analysed steps. A rank's neighbour is the peer of
--   its calls (collectives.peer_rank, or the other member of a 2-rank group). The neighbour a rank
--   first SENDS to in a step is downstream (it forwards activations before it can get gradients
--   back); the one it first RECEIVES from is upstream. The first stage has no upstream; stages
--   follow the downstream links. Without known peers (traces not recorded by bprof, groups of more
--   than 2 ranks) a pipeline is its send/recv group, in the group's rank order (Megatron and
--   torchtitan list a pipeline group by stage), reversed when it is the last member that starts
--   its steps with a send. One chain of stages is one pipeline (one per DP/TP position).
-- * Interleaved 1F1B (Megatron's virtual pipeline: stage s holds model chunks s, s+p, .., the last
--   stage sends to the first for the next chunk) makes the downstream links a ring when p >= 3: every
--   rank has an upstream neighbour. The ring's first stage is the rank that starts its steps with a
--   send (it feeds the data into model chunk 0); the others start with a receive. With p = 2 the
--   ring is the two ranks' one link both ways, a chain in the send/recv calls.
-- * num_microbatches (m) = the first stage's forward sends per step = (sends + receives) per step /
--   2 per neighbour on any stage (an activation and a gradient per micro-batch and link). In a ring
--   of v chunks per stage, the first stage sends v*m activations downstream and (v-1)*m gradients
--   upstream (none for model chunk 0): m = the difference, v = downstream sends / m, and every
--   stage's calls per step are 2*(2v-1)*m (first and last) or 4*v*m (the others).
-- * schedule: a ring is interleaved-1f1b. Else, on the first stage, the forward sends before its
--   first gradient arrives: all m (GPipe) or at most p (1F1B). With m <= p the two send the same
--   pattern: not detected. A chain whose first stage sends (2v-1)*m per step, with v chunks, m
--   micro-batches and interleaving declared (bprof_model.chunks, .microbatches, .schedule), is
--   interleaved-1f1b from the declaration: with p = 2 (or without known peers) the calls cannot tell
--   it from 1F1B with (2v-1)*m micro-batches.
-- * bubble_ns of a rank's step = the exposed communication of the pipeline's send/recv calls: time
--   the rank's timeline (the device; the main thread on CPU traces) is in a send/recv (NCCL kernel
--   in flight, main thread blocked in the c10d/gloo call) with no compute running =
--   breakdown_dims.exposed_comm_ns of the parallel dimension of the send/recv groups (pp; a group
--   that also carries collectives brings their exposed time too). That is waiting for a neighbour,
--   plus the transfer itself, which the theory counts as free. Host gaps (idle) are the rank's own
--   time, not bubble.
-- * busy_ns = span_ns - bubble_ns - the exposed communication of the groups outside the micro-batches'
--   work (dims dp, embedding, world: breakdown_dims): the stage's own work in the step (compute, its
--   host gaps, the optimizer, its tensor/context/expert-parallel collectives, which each micro-batch
--   runs). Waiting in a collective outside the pipeline (Megatron's embedding-group all-reduce, the
--   data-parallel gradient sync) is not the stage's work: counting it made a stage waiting for its
--   peers look heavy (721 ms claimed where its compute gave about 400). bubble_frac = bubble_ns / span_ns.
-- * Theory, with p stages, m micro-batches and equal stages: (p-1)/(m+p-1) for 1F1B and GPipe
--   (v = 1), (p-1)/(v*m+p-1) for interleaved 1F1B with v chunks per stage. Work outside
--   the pipeline (optimizer, gradient sync) is not in the theory: a large share of it lowers the
--   measured fraction by about that share.
-- * Run figures: per stage and step the median over the stage's ranks (pipelines); per stage the
--   median over steps; bubble_frac_measured = the mean over stages of their bubble_frac.

CREATE TABLE IF NOT EXISTS bubbles_stages (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, pipeline INTEGER NOT NULL, stage INTEGER NOT NULL,
    step INTEGER NOT NULL, num_microbatches INTEGER NOT NULL,
    span_ns BIGINT NOT NULL, compute_ns BIGINT NOT NULL, busy_ns BIGINT NOT NULL, bubble_ns BIGINT NOT NULL,
    bubble_frac DOUBLE NOT NULL,
    PRIMARY KEY (run_id, rank, step)
);
COMMENT ON TABLE bubbles_stages IS 'Each pipeline rank''s step: its stage, the micro-batches through it, and how long it waited for its neighbours (the bubble).';
COMMENT ON COLUMN bubbles_stages.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN bubbles_stages.rank IS 'Global rank.';
COMMENT ON COLUMN bubbles_stages.pipeline IS 'The pipeline (chain or ring of stages) the rank belongs to, named by the global rank of its first stage.';
COMMENT ON COLUMN bubbles_stages.stage IS 'Pipeline stage, 0 = first (it feeds the data in and sends activations forward).';
COMMENT ON COLUMN bubbles_stages.step IS 'Profiler step.';
COMMENT ON COLUMN bubbles_stages.num_microbatches IS 'Micro-batches through this stage in the step: its send/recv calls / (2 per neighbour), per chunk boundary with interleaving: / (2*(2v-1)) on the first and last stage, / (4v) on the others.';
COMMENT ON COLUMN bubbles_stages.span_ns IS 'Step span (timeline_spans.dur_ns): the step time.';
COMMENT ON COLUMN bubbles_stages.compute_ns IS 'Compute time in the step, hidden communication included (breakdown_steps.compute_ns + overlapped_comm_ns).';
COMMENT ON COLUMN bubbles_stages.busy_ns IS 'span_ns - bubble_ns - exposed communication of the groups outside the micro-batches (dp, embedding, world): the stage''s own work (compute, host gaps, optimizer, its tp/cp/ep collectives), not waiting in a gradient or embedding all-reduce.';
COMMENT ON COLUMN bubbles_stages.bubble_ns IS 'Time in send/recv with no compute running: waiting for a neighbour stage, plus the transfer (exposed pipeline communication, breakdown_dims).';
COMMENT ON COLUMN bubbles_stages.bubble_frac IS 'bubble_ns / span_ns.';

CREATE TABLE IF NOT EXISTS bubbles_runs (
    run_id INTEGER NOT NULL PRIMARY KEY,
    num_pipelines INTEGER NOT NULL, num_stages INTEGER NOT NULL, num_microbatches INTEGER, num_chunks INTEGER NOT NULL,
    schedule VARCHAR, stages_source VARCHAR NOT NULL, microbatches_source VARCHAR, schedule_source VARCHAR,
    declared_stages INTEGER, declared_microbatches INTEGER, declared_schedule VARCHAR, p2p_dims VARCHAR[],
    num_steps INTEGER NOT NULL, median_step_ns BIGINT,
    bubble_frac_measured DOUBLE, bubble_frac_theory DOUBLE, excess_frac DOUBLE,
    excess_lost_ns BIGINT, bubble_frac_mad DOUBLE, above_theory_every_step BOOLEAN,
    slowest_stage INTEGER, slowest_busy_ns BIGINT, median_other_busy_ns BIGINT, slowest_ratio DOUBLE,
    slowest_ratio_mad DOUBLE, slowest_every_step BOOLEAN, imbalance_lost_ns BIGINT
);
COMMENT ON TABLE bubbles_runs IS 'The pipeline of a run (stages, micro-batches, schedule, and where each came from), its measured bubble against the schedule''s theory, and its slowest stage.';
COMMENT ON COLUMN bubbles_runs.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN bubbles_runs.num_pipelines IS 'Chains (or rings) of stages found (one per data/tensor-parallel position).';
COMMENT ON COLUMN bubbles_runs.num_stages IS 'Pipeline stages p (the most common chain or ring length).';
COMMENT ON COLUMN bubbles_runs.num_microbatches IS 'Micro-batches per step m: the first stage''s forward sends per step (most common; in a ring its downstream less its upstream sends), or declared when it sends none or interleaving is declared and its sends fit.';
COMMENT ON COLUMN bubbles_runs.num_chunks IS 'Model chunks per stage v: 1 for 1F1B and GPipe; for interleaved 1F1B the first stage''s downstream sends / m in a ring (p >= 3, schedule_source p2p), else bprof_model.chunks when the first stage''s sends per step are (2v-1)*m (schedule_source declared).';
COMMENT ON COLUMN bubbles_runs.schedule IS '1f1b, gpipe or interleaved-1f1b (detected, else declared); NULL when neither tells (the theory is the same for 1F1B and GPipe).';
COMMENT ON COLUMN bubbles_runs.stages_source IS 'p2p_peers (peers of the send/recv calls) or p2p_group (rank order of the send/recv groups).';
COMMENT ON COLUMN bubbles_runs.microbatches_source IS 'p2p (counted) or declared (bprof_model.microbatches).';
COMMENT ON COLUMN bubbles_runs.schedule_source IS 'p2p (a ring of stages, or the first stage''s send/recv order), declared (bprof_model.schedule) or NULL.';
COMMENT ON COLUMN bubbles_runs.declared_stages IS 'bprof_model.pp declared by the training script, for the cross-check; NULL if none.';
COMMENT ON COLUMN bubbles_runs.declared_microbatches IS 'bprof_model.microbatches declared by the training script; NULL if none.';
COMMENT ON COLUMN bubbles_runs.declared_schedule IS 'bprof_model.schedule declared by the training script (interleaved read as interleaved-1f1b); NULL if none.';
COMMENT ON COLUMN bubbles_runs.p2p_dims IS 'Parallel dimensions (breakdown_groups.dim) of the send/recv groups, whose exposed communication is the bubble.';
COMMENT ON COLUMN bubbles_runs.num_steps IS 'Steps analysed.';
COMMENT ON COLUMN bubbles_runs.median_step_ns IS 'Median over steps of the step span (mean over stages).';
COMMENT ON COLUMN bubbles_runs.bubble_frac_measured IS 'Mean over stages of each stage''s median bubble_frac.';
COMMENT ON COLUMN bubbles_runs.bubble_frac_theory IS '(p-1)/(v*m+p-1): the schedule''s bubble with equal stages and free communication.';
COMMENT ON COLUMN bubbles_runs.excess_frac IS 'bubble_frac_measured - bubble_frac_theory (negative: below theory).';
COMMENT ON COLUMN bubbles_runs.excess_lost_ns IS 'Step time above the theoretical bubble: median_step_ns * excess_frac / (1 - theory) = step - mean busy / (1 - theory), the step with the same total work spread evenly over the stages and the theoretical bubble share; 0 when at or below theory.';
COMMENT ON COLUMN bubbles_runs.bubble_frac_mad IS 'MAD over steps of the per-step bubble fraction (mean over stages): what it varies by anyway (0 with one step).';
COMMENT ON COLUMN bubbles_runs.above_theory_every_step IS 'Whether every analysed step''s bubble fraction (mean over stages) is above theory.';
COMMENT ON COLUMN bubbles_runs.slowest_stage IS 'Stage with the largest median busy_ns.';
COMMENT ON COLUMN bubbles_runs.slowest_busy_ns IS 'Its median busy_ns per step.';
COMMENT ON COLUMN bubbles_runs.median_other_busy_ns IS 'Median over the other stages of their median busy_ns.';
COMMENT ON COLUMN bubbles_runs.slowest_ratio IS 'slowest_busy_ns / median_other_busy_ns.';
COMMENT ON COLUMN bubbles_runs.slowest_ratio_mad IS 'MAD over steps of the per-step ratio (the slowest stage''s busy_ns / the other stages'' median in that step); 0 with one step.';
COMMENT ON COLUMN bubbles_runs.slowest_every_step IS 'Whether the slowest stage is the slowest in every analysed step.';
COMMENT ON COLUMN bubbles_runs.imbalance_lost_ns IS 'Step time the slowest stage costs, written by bubbles.py: with every send/recv matched, the balanced-stages what-if (the measured step graph replayed with that stage''s own work at the others'' median; median over steps of measured - predicted); else T(t) - T(t with the slowest stage at the others'' median), T the step of m equal micro-batches through stages taking t = busy_ns / m each (bprof.whatif.pipeline.flow_shop_ns: sum of t + (m-1) * max t).';

-- The send/recv calls of the analysed steps, with the peer where it is known.
CREATE OR REPLACE TEMP TABLE _bubbles_p2p AS
SELECT c.rank, c.step, c.call_index, c.op, c.pg_name, c.pg_desc, c.pg_ranks,
    coalesce(c.peer_rank, CASE WHEN len(c.pg_ranks) = 2 AND list_contains(c.pg_ranks, c.rank)
                               THEN list_filter(c.pg_ranks, lambda x: x <> c.rank)[1] END) AS peer
FROM collectives c
JOIN timeline_spans s ON s.run_id = c.run_id AND s.rank = c.rank AND s.step = c.step
WHERE c.run_id = $run_id AND c.is_p2p AND c.op IN ('send', 'recv') AND c.step >= 0 AND s.dur_ns > 0;

-- Per rank: are all its peers known, its send/recv group, does it start its steps with a send.
CREATE OR REPLACE TEMP TABLE _bubbles_rank AS
WITH firsts AS (
    SELECT rank, step, arg_min(op, call_index) AS first_op FROM _bubbles_p2p GROUP BY rank, step
), starts AS (
    SELECT rank, count(*) FILTER (WHERE first_op = 'send') > count(*) FILTER (WHERE first_op = 'recv') AS starts_with_send
    FROM firsts GROUP BY rank
)
SELECT p.rank, bool_and(p.peer IS NOT NULL) AS peers_known, mode(p.pg_ranks) AS pg_ranks,
    any_value(s.starts_with_send) AS starts_with_send
FROM _bubbles_p2p p JOIN starts s USING (rank) GROUP BY p.rank;

-- Algorithm: a link (rank, peer) is downstream when, in most steps, the rank's first call with that
-- peer is a send.
CREATE OR REPLACE TEMP TABLE _bubbles_links AS
SELECT rank, peer, count(*) FILTER (WHERE first_op = 'send') > count(*) FILTER (WHERE first_op = 'recv') AS downstream
FROM (SELECT rank, step, peer, arg_min(op, call_index) AS first_op
      FROM _bubbles_p2p WHERE peer IS NOT NULL GROUP BY rank, step, peer)
GROUP BY rank, peer;

-- Algorithm: with known peers, walk each chain from its first stage (a rank with a downstream link
-- and no upstream one) along the single downstream link of each rank; the walk stops at a rank
-- without one, or where it would close a ring. A ring is walked from the rank that starts its steps
-- with a send and has one upstream link, and kept only when the walk comes back to it. Without known
-- peers, the chain is the send/recv group in its rank order, reversed when its last member is the
-- one that starts with a send.
CREATE OR REPLACE TEMP TABLE _bubbles_chain AS
WITH RECURSIVE down AS (
    SELECT rank, any_value(peer) AS peer FROM _bubbles_links WHERE downstream GROUP BY rank HAVING count(*) = 1
), heads AS (
    SELECT r.rank, EXISTS (SELECT 1 FROM _bubbles_links l WHERE l.rank = r.rank AND NOT l.downstream) AS ring
    FROM _bubbles_rank r
    WHERE r.peers_known AND r.rank IN (SELECT rank FROM down)
      AND (SELECT count(*) FILTER (WHERE NOT l.downstream) FROM _bubbles_links l WHERE l.rank = r.rank)
          <= CASE WHEN r.starts_with_send THEN 1 ELSE 0 END
), walk(pipeline, rank, stage) AS (
    SELECT rank, rank, 0 FROM heads
    UNION ALL
    SELECT w.pipeline, d.peer, w.stage + 1 FROM walk w JOIN down d ON d.rank = w.rank
    WHERE d.peer <> w.pipeline AND w.stage < (SELECT count(*) FROM _bubbles_rank)
), closed AS (  -- rings whose walk comes back to their first stage
    SELECT DISTINCT w.pipeline FROM walk w JOIN down d ON d.rank = w.rank AND d.peer = w.pipeline
), grouped AS (
    SELECT r.rank, r.pg_ranks, list_position(r.pg_ranks, r.rank) - 1 AS pos, len(r.pg_ranks) AS n,
        coalesce(l.starts_with_send AND NOT f.starts_with_send, false) AS reversed
    FROM _bubbles_rank r
    LEFT JOIN _bubbles_rank f ON f.rank = r.pg_ranks[1]
    LEFT JOIN _bubbles_rank l ON l.rank = r.pg_ranks[len(r.pg_ranks)]
    WHERE NOT r.peers_known AND list_contains(r.pg_ranks, r.rank) AND len(r.pg_ranks) > 1
), chains AS (
    SELECT w.pipeline, w.rank, w.stage, 'p2p_peers' AS source, h.ring FROM walk w JOIN heads h ON h.rank = w.pipeline
    WHERE NOT h.ring OR w.pipeline IN (SELECT pipeline FROM closed)
    UNION ALL
    SELECT CASE WHEN reversed THEN pg_ranks[n] ELSE pg_ranks[1] END, rank,
        CASE WHEN reversed THEN n - 1 - pos ELSE pos END, 'p2p_group', false
    FROM grouped
)
SELECT c.*, max(c.stage) OVER (PARTITION BY c.pipeline) + 1 AS num_stages
FROM chains c
QUALIFY row_number() OVER (PARTITION BY c.rank ORDER BY c.pipeline, c.stage) = 1;

-- Algorithm: the shape (p, m, v, schedule) from the chains and the first stages' calls (per step,
-- the most common count over the first stages' steps), cross-checked with the declaration. In order:
-- a ring whose first stage's downstream sends d and upstream sends u give m = d - u > 0 dividing d
-- (v = d / m, interleaved-1f1b from the calls); a run declaring interleaving with v >= 2 chunks and m
-- micro-batches whose first stage sends (2v-1)*m per step (interleaved-1f1b, m and v declared); else
-- m = the first stage's sends, v = 1, 1F1B or GPipe by its sends before its first receive.
CREATE OR REPLACE TEMP TABLE _bubbles_shape AS
WITH declared AS (
    SELECT TRY_CAST(json_extract(metadata, '$.bprof_model.pp') AS INTEGER) AS pp,
        TRY_CAST(json_extract(metadata, '$.bprof_model.microbatches') AS INTEGER) AS microbatches,
        TRY_CAST(json_extract(metadata, '$.bprof_model.chunks') AS INTEGER) AS chunks,
        CASE WHEN lower(json_extract_string(metadata, '$.bprof_model.schedule')) = 'interleaved' THEN 'interleaved-1f1b'
             ELSE lower(json_extract_string(metadata, '$.bprof_model.schedule')) END AS schedule
    FROM runs WHERE run_id = $run_id
), shape AS (
    SELECT count(DISTINCT pipeline) AS num_pipelines, mode(num_stages) AS p, mode(source) AS source, mode(ring) AS ring
    FROM _bubbles_chain
), neighbours AS (  -- each first stage's downstream (stage 1) and upstream (last stage of a ring) rank
    SELECT f.rank, any_value(c.rank) FILTER (WHERE c.stage = 1) AS down,
        any_value(c.rank) FILTER (WHERE c.stage = c.num_stages - 1 AND c.ring) AS up
    FROM _bubbles_chain f JOIN _bubbles_chain c ON c.pipeline = f.pipeline
    WHERE f.stage = 0 GROUP BY f.rank
), first_steps AS (
    SELECT p.rank, p.step, count(*) FILTER (WHERE p.op = 'send') AS sends,
        count(*) FILTER (WHERE p.op = 'send' AND p.call_index < r.first_recv) AS sends_before_recv,
        count(*) FILTER (WHERE p.op = 'send' AND p.peer = n.down) AS sends_down,
        count(*) FILTER (WHERE p.op = 'send' AND p.peer = n.up) AS sends_up
    FROM _bubbles_p2p p
    JOIN neighbours n ON n.rank = p.rank
    JOIN (SELECT rank, step, coalesce(min(call_index) FILTER (WHERE op = 'recv'), 2147483647) AS first_recv
          FROM _bubbles_p2p GROUP BY rank, step) r ON r.rank = p.rank AND r.step = p.step
    GROUP BY p.rank, p.step
), counted AS (
    SELECT mode(sends) AS m, mode(sends_before_recv) AS before, mode(sends_down) AS down, mode(sends_up) AS up
    FROM first_steps WHERE sends > 0
), ring AS (
    SELECT CASE WHEN s.ring AND c.down > c.up AND c.down % nullif(c.down - c.up, 0) = 0 THEN c.down - c.up END AS m,
        CASE WHEN s.ring AND c.down > c.up AND c.down % nullif(c.down - c.up, 0) = 0 THEN c.down // nullif(c.down - c.up, 0) END AS v
    FROM shape s, counted c
), fits AS (  -- interleaving declared, and the first stage sends what it would
    SELECT d.schedule = 'interleaved-1f1b' AND d.chunks >= 2 AND c.m = (2 * d.chunks - 1) * d.microbatches AS ok
    FROM declared d, counted c
)
SELECT s.num_pipelines, s.p, s.source, d.pp, d.microbatches, d.chunks, d.schedule,
    CASE WHEN r.m IS NOT NULL THEN r.m WHEN f.ok THEN d.microbatches ELSE coalesce(c.m, d.microbatches) END AS m,
    CASE WHEN r.m IS NOT NULL OR (c.m IS NOT NULL AND NOT coalesce(f.ok, false)) THEN 'p2p'
         WHEN d.microbatches IS NOT NULL THEN 'declared' END AS m_source,
    CASE WHEN r.m IS NOT NULL THEN r.v WHEN f.ok THEN d.chunks ELSE 1 END AS v,
    CASE WHEN r.m IS NOT NULL THEN 'interleaved-1f1b' WHEN f.ok THEN NULL
         WHEN c.m > s.p AND c.before >= c.m THEN 'gpipe' WHEN c.m > s.p AND c.before <= s.p THEN '1f1b' END AS detected
FROM shape s, counted c, declared d, ring r, fits f
WHERE s.p IS NOT NULL;

DELETE FROM bubbles_stages WHERE run_id = $run_id;
DELETE FROM bubbles_runs WHERE run_id = $run_id;

INSERT INTO bubbles_stages
WITH calls AS (
    SELECT rank, step, count(*) AS num_calls FROM _bubbles_p2p GROUP BY rank, step
), dims AS (
    SELECT DISTINCT g.dim FROM _bubbles_p2p p
    JOIN breakdown_groups g ON g.run_id = $run_id AND g.pg_name IS NOT DISTINCT FROM p.pg_name
         AND g.pg_desc IS NOT DISTINCT FROM p.pg_desc AND g.pg_ranks IS NOT DISTINCT FROM p.pg_ranks
), bubble AS (
    SELECT rank, step, sum(exposed_comm_ns) AS bubble_ns FROM breakdown_dims
    WHERE run_id = $run_id AND dim IN (SELECT dim FROM dims) GROUP BY rank, step
), outside AS (
    SELECT rank, step, sum(exposed_comm_ns) AS outside_ns FROM breakdown_dims
    WHERE run_id = $run_id AND dim IN ('dp', 'embedding', 'world') AND dim NOT IN (SELECT dim FROM dims)
    GROUP BY rank, step
), rows AS (
    SELECT b.rank, ch.pipeline, ch.stage, b.step,
        coalesce(c.num_calls, 0) // CASE WHEN ch.stage = 0 OR ch.stage = ch.num_stages - 1 THEN 2 * (2 * sh.v - 1)
                                         ELSE 4 * sh.v END AS num_microbatches,
        b.span_ns, b.compute_ns + b.overlapped_comm_ns AS compute_ns,
        least(CAST(coalesce(bb.bubble_ns, 0) AS BIGINT), b.span_ns) AS bubble_ns,
        greatest(b.span_ns - coalesce(bb.bubble_ns, 0) - coalesce(o.outside_ns, 0), 0) AS busy_ns
    FROM breakdown_steps b
    JOIN _bubbles_chain ch ON ch.rank = b.rank
    CROSS JOIN _bubbles_shape sh
    LEFT JOIN calls c ON c.rank = b.rank AND c.step = b.step
    LEFT JOIN bubble bb ON bb.rank = b.rank AND bb.step = b.step
    LEFT JOIN outside o ON o.rank = b.rank AND o.step = b.step
    WHERE b.run_id = $run_id AND b.step >= 0 AND b.span_ns > 0
)
SELECT $run_id, rank, pipeline, stage, step, num_microbatches, span_ns, compute_ns,
    busy_ns, bubble_ns, bubble_ns / span_ns
FROM rows;

-- Algorithm: the shape (p, m, v, schedule) from _bubbles_shape; per stage and
-- step the median over the stage's ranks; per stage the median over steps; the run figures from
-- those. The slowest stage's cost (imbalance_lost_ns) is replayed by bubbles.py with the what-if
-- engine: m equal micro-batches through stages taking t_s each, and again with the slowest stage's
-- t at the median of the others'.
INSERT INTO bubbles_runs
WITH resolved AS (
    SELECT num_pipelines, p, source, m, m_source, v, detected, pp, microbatches, schedule FROM _bubbles_shape
), stage_step AS (
    SELECT stage, step, median(bubble_ns) AS bubble_ns, median(busy_ns) AS busy_ns, median(span_ns) AS span_ns,
        median(bubble_frac) AS bubble_frac
    FROM bubbles_stages WHERE run_id = $run_id GROUP BY stage, step
), per_stage AS (
    SELECT stage, median(busy_ns) AS busy_ns, median(bubble_frac) AS bubble_frac FROM stage_step GROUP BY stage
), per_step AS (
    SELECT step, avg(span_ns) AS span_ns, avg(bubble_frac) AS bubble_frac,
        arg_max(stage, busy_ns) AS slowest_stage
    FROM stage_step GROUP BY step
), slowest AS (
    SELECT arg_max(stage, busy_ns) AS stage, max(busy_ns) AS busy_ns FROM per_stage
), others AS (
    SELECT median(busy_ns) AS median_busy_ns, max(busy_ns) AS max_busy_ns
    FROM per_stage WHERE stage <> (SELECT stage FROM slowest)
), measured AS (
    SELECT avg(bubble_frac) AS frac FROM per_stage
), steps AS (
    SELECT count(*) AS num_steps, median(span_ns) AS step_ns, mad(bubble_frac) AS frac_mad FROM per_step
), step_ratio AS (
    SELECT ss.step, max(ss.busy_ns) FILTER (WHERE ss.stage = sl.stage)
                    / nullif(median(ss.busy_ns) FILTER (WHERE ss.stage <> sl.stage), 0) AS ratio
    FROM stage_step ss, slowest sl GROUP BY ss.step
), figures AS (
    SELECT r.*, CASE WHEN r.detected IS NOT NULL THEN r.detected ELSE r.schedule END AS used_schedule,
        (r.p - 1) / (r.v * r.m + r.p - 1) AS theory, st.*, me.frac AS measured,
        sl.stage AS slowest_stage, sl.busy_ns AS slowest_busy_ns, o.median_busy_ns, o.max_busy_ns
    FROM resolved r, steps st, measured me, slowest sl, others o
)
SELECT $run_id, num_pipelines, p, m, v, used_schedule, source, m_source,
    CASE WHEN detected IS NOT NULL THEN 'p2p' WHEN schedule IS NOT NULL THEN 'declared' END,
    pp, microbatches, schedule,
    (SELECT list(DISTINCT g.dim ORDER BY g.dim) FROM _bubbles_p2p x
     JOIN breakdown_groups g ON g.run_id = $run_id AND g.pg_name IS NOT DISTINCT FROM x.pg_name
          AND g.pg_desc IS NOT DISTINCT FROM x.pg_desc AND g.pg_ranks IS NOT DISTINCT FROM x.pg_ranks),
    num_steps, CAST(step_ns AS BIGINT),
    measured, theory, measured - theory,
    CAST(greatest(0, step_ns * (measured - theory) / (1 - theory)) AS BIGINT),
    frac_mad,
    (SELECT bool_and(bubble_frac > theory) FROM per_step),
    slowest_stage, CAST(slowest_busy_ns AS BIGINT), CAST(median_busy_ns AS BIGINT),
    slowest_busy_ns / nullif(median_busy_ns, 0), (SELECT mad(ratio) FROM step_ratio),
    (SELECT bool_and(slowest_stage = f.slowest_stage) FROM per_step),
    CAST(NULL AS BIGINT)  -- imbalance_lost_ns: bubbles.py
FROM figures f
WHERE p IS NOT NULL AND num_steps > 0;
