-- Which rank (or host) holds the others up, how often, and why? Per rank: how often it arrives
-- last at the collectives it joins, the wait it imposes on its peers, its compute time against the
-- median rank (a score in the spirit of NVIDIA's straggler detector: the median rank's compute over
-- this rank's), and the evidence for a cause class. stragglers.py prices the candidates with the
-- counterfactual engine and writes lost_ns, flagged and cause.
-- Reads match_instances, match_members (aligned clocks), collperf_instances, breakdown_steps,
-- ranks; writes stragglers_ranks.

CREATE TABLE IF NOT EXISTS stragglers_ranks (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, host VARCHAR,
    num_instances BIGINT NOT NULL, num_last BIGINT NOT NULL, last_frac DOUBLE,
    imposed_wait_ns BIGINT NOT NULL, compute_ns BIGINT, host_busy_ns BIGINT, transfer_ratio DOUBLE,
    score DOUBLE, lost_ns BIGINT, flagged BOOLEAN NOT NULL, cause VARCHAR,
    PRIMARY KEY (run_id, rank)
);
COMMENT ON TABLE stragglers_ranks IS 'Straggler evidence per rank: arrivals last, wait imposed, compute against the median rank, and the counterfactual cost.';
COMMENT ON COLUMN stragglers_ranks.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN stragglers_ranks.rank IS 'Global rank.';
COMMENT ON COLUMN stragglers_ranks.host IS 'Host of the rank.';
COMMENT ON COLUMN stragglers_ranks.num_instances IS 'Complete collective and p2p instances the rank joined (aligned clocks).';
COMMENT ON COLUMN stragglers_ranks.num_last IS 'Of those, how many it arrived at last (collperf_instances.last_rank: the lowest rank on a tie).';
COMMENT ON COLUMN stragglers_ranks.last_frac IS 'num_last / num_instances.';
COMMENT ON COLUMN stragglers_ranks.imposed_wait_ns IS 'Per step (median over steps), the waits of its peers at the instances it arrived at last.';
COMMENT ON COLUMN stragglers_ranks.compute_ns IS 'Median per step of its compute time (compute + overlapped communication of the breakdown).';
COMMENT ON COLUMN stragglers_ranks.host_busy_ns IS 'Median per step of its idle + other time (host-side: launch gaps, syncs, GC, data, Python).';
COMMENT ON COLUMN stragglers_ranks.transfer_ratio IS 'Median over its instances of their transfer time over the median transfer of instances of the same op and size on other groups; above 1 when its links are slow.';
COMMENT ON COLUMN stragglers_ranks.score IS 'Median rank''s compute_ns over this rank''s: below 1 means slower than the median rank.';
COMMENT ON COLUMN stragglers_ranks.lost_ns IS 'How much shorter the job''s step would be if this rank worked like the median rank of its role (median over steps of the counterfactual engine''s gain; 0 unless at least 75% of the steps gain half of it: not consistent); NULL when not evaluated.';
COMMENT ON COLUMN stragglers_ranks.flagged IS 'lost_ns >= max(2% of the median step, 3 x the median absolute deviation of the step time).';
COMMENT ON COLUMN stragglers_ranks.cause IS 'For flagged ranks: device (its compute exceeds the median rank''s by more than its host-side time does) or host.';

-- Algorithm (scale: 20 million member rows per step at 10,240 ranks, so no window over members):
-- a role is a small integer, numbered per (op, group size) over the instances and split by side
-- for send/recv; who arrived last at an instance and the waits it imposed come from
-- collperf_instances (last_rank, wait_ns), computed there in one pass.
CREATE OR REPLACE TEMP TABLE _st_instances AS
WITH kinds AS (
    SELECT op, group_size, CAST(row_number() OVER (ORDER BY op, group_size) AS INTEGER) AS kind
    FROM (SELECT DISTINCT op, group_size FROM match_instances WHERE run_id = $run_id AND status = 'complete')
)
SELECT i.instance_id, i.step, i.is_p2p, i.src_rank, k.kind
FROM match_instances i JOIN kinds k ON k.op = i.op AND k.group_size IS NOT DISTINCT FROM i.group_size
WHERE i.run_id = $run_id AND i.status = 'complete';

CREATE OR REPLACE TEMP TABLE _st_members AS
SELECT m.instance_id, m.rank, i.step,
    -- what the member does: its op and group size; a send and a recv are different roles
    2 * i.kind + CASE WHEN i.is_p2p AND m.rank = i.src_rank THEN 1 ELSE 0 END AS role_id,
    m.arrival_aligned_ns, m.end_aligned_ns
FROM match_members m JOIN _st_instances i USING (instance_id)
WHERE m.run_id = $run_id AND m.arrival_aligned_ns IS NOT NULL;

INSERT INTO stragglers_ranks
WITH last AS (
    SELECT c.instance_id, c.step, c.last_rank, c.wait_ns AS peers_wait_ns
    FROM collperf_instances c WHERE c.run_id = $run_id AND c.instance_id IN (SELECT instance_id FROM _st_instances)
), per_rank AS (
    SELECT rank, count(*) AS num_instances FROM _st_members GROUP BY rank
), last_rank AS (
    SELECT last_rank AS rank, count(*) AS num_last FROM last GROUP BY ALL
), imposed AS (
    SELECT last_rank AS rank, step, sum(peers_wait_ns) AS wait_ns FROM last GROUP BY ALL
), imposed_med AS (
    SELECT rank, median(wait_ns) AS wait_ns FROM imposed GROUP BY rank
), bd AS (
    SELECT rank, median(compute_ns + overlapped_comm_ns) AS compute_ns, median(idle_ns + other_ns) AS host_ns
    FROM breakdown_steps WHERE run_id = $run_id AND step >= 0 GROUP BY rank
), transfer AS (
    -- an instance's transfer against the median of same-op, same-size instances (all groups)
    SELECT c.instance_id, c.transfer_ns / nullif(median(c.transfer_ns) OVER (PARTITION BY c.op, c.bytes), 0) AS ratio
    FROM collperf_instances c WHERE c.run_id = $run_id AND c.transfer_ns > 0
), transfer_rank AS (
    SELECT m.rank, median(t.ratio) AS ratio FROM _st_members m JOIN transfer t USING (instance_id) GROUP BY m.rank
)
SELECT $run_id, r.rank, r.host, coalesce(p.num_instances, 0), coalesce(l.num_last, 0),
    l.num_last / nullif(p.num_instances, 0),
    CAST(coalesce(i.wait_ns, 0) AS BIGINT), CAST(bd.compute_ns AS BIGINT), CAST(bd.host_ns AS BIGINT), t.ratio,
    (SELECT median(compute_ns) FROM bd) / nullif(bd.compute_ns, 0),
    NULL, false, NULL
FROM ranks r
LEFT JOIN per_rank p USING (rank) LEFT JOIN last_rank l USING (rank) LEFT JOIN imposed_med i USING (rank)
LEFT JOIN bd USING (rank) LEFT JOIN transfer_rank t USING (rank)
WHERE r.run_id = $run_id;
