-- Which rank (or host) holds the others up, how often, and why? Per rank: how often it arrives
-- last at the collectives it joins, the wait it imposes on its peers, its compute time against the
-- median rank (a score in the spirit of NVIDIA's straggler detector: the median rank's compute over
-- this rank's), and the evidence for a cause class. stragglers.py prices the candidates with the
-- counterfactual engine and writes lost_ns, flagged and cause.
-- Reads match_instances, match_members_aligned, collperf_instances, breakdown_steps,
-- ranks; writes stragglers_ranks.

CREATE TABLE IF NOT EXISTS stragglers_ranks (
    run_id INTEGER NOT NULL, rank INTEGER NOT NULL, host VARCHAR,
    num_instances BIGINT NOT NULL, num_last BIGINT NOT NULL, last_frac DOUBLE,
    imposed_wait_ns BIGINT NOT NULL, compute_ns BIGINT, host_busy_ns BIGINT, transfer_ratio DOUBLE,
    score DOUBLE, lost_ns BIGINT, flagged BOOLEAN NOT NULL, cause VARCHAR,
    extra_own_ns BIGINT, spread_ns BIGINT, measurably_slower BOOLEAN,
    PRIMARY KEY (run_id, rank)
);
COMMENT ON TABLE stragglers_ranks IS 'Straggler evidence per rank: arrivals last, wait imposed, compute against the median rank, and the counterfactual cost.';
COMMENT ON COLUMN stragglers_ranks.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN stragglers_ranks.rank IS 'Global rank.';
COMMENT ON COLUMN stragglers_ranks.host IS 'Host of the rank.';
COMMENT ON COLUMN stragglers_ranks.num_instances IS 'Complete collective and p2p instances the rank joined on aligned clocks, in the analysed steps (those with spans).';
COMMENT ON COLUMN stragglers_ranks.num_last IS 'Of those, how many it arrived at last (collperf_instances.last_rank: the lowest rank on a tie).';
COMMENT ON COLUMN stragglers_ranks.last_frac IS 'num_last / num_instances.';
COMMENT ON COLUMN stragglers_ranks.imposed_wait_ns IS 'Per step (median over steps), the waits of its peers at the instances it arrived at last.';
COMMENT ON COLUMN stragglers_ranks.compute_ns IS 'Median per step of its compute time (compute + overlapped communication of the breakdown).';
COMMENT ON COLUMN stragglers_ranks.host_busy_ns IS 'Median per step of its idle + other time (host-side: launch gaps, syncs, GC, data, Python).';
COMMENT ON COLUMN stragglers_ranks.transfer_ratio IS 'Median over the analysed steps of the median over its instances in the step of their transfer time over the median transfer of instances of the same op and size (all groups); above 1 when its links are slow.';
COMMENT ON COLUMN stragglers_ranks.score IS 'Median rank''s compute_ns over this rank''s: below 1 means slower than the median rank.';
COMMENT ON COLUMN stragglers_ranks.lost_ns IS 'How much shorter the job''s step would be if this rank worked like the median rank of its role (median over steps of the counterfactual engine''s gain; 0 unless at least 75% of the steps gain half of it, not consistent, or the rank is measurably_slower, which shows it recurs); NULL when not evaluated.';
COMMENT ON COLUMN stragglers_ranks.flagged IS 'lost_ns >= max(2% of the median step, 3 x the median absolute deviation of the step time).';
COMMENT ON COLUMN stragglers_ranks.cause IS 'For ranks with a finding (flagged, or measurably slower with a cost under the threshold): device (its compute exceeds the median peer''s by more than its host-side time does) or host.';
COMMENT ON COLUMN stragglers_ranks.extra_own_ns IS 'Median over steps of its own time (breakdown_steps span_ns - exposed_comm_ns: compute, host-side and copy time, no waits for peers) minus the median of its peers'' (the other ranks of its role signature, as the cost compares them); NULL when not evaluated or without peers.';
COMMENT ON COLUMN stragglers_ranks.spread_ns IS 'Its peers'' step-to-step spread: 1.4826 x the median absolute change of a peer''s own time from one analysed step to the next, over sqrt(2) (the standard deviation of one step''s own time, robustly); NULL when not evaluated or with fewer than two steps.';
COMMENT ON COLUMN stragglers_ranks.measurably_slower IS 'Its own time exceeds its peers'' median by more than 3 x spread_ns in at least 75% of the steps (and two at least): slower than its peers beyond their noise, whatever its cost. It decides only the info findings of ranks under the flag threshold (a flagged rank is flagged by its cost: on a contended CPU run its peers'' own time can swing by more than a third of the extra); NULL when not evaluated (not a candidate, no peers, one step).';

-- Algorithm (scale: 20 million member rows per step at 10,240 ranks, so no window or join over
-- all members here): a role is a small integer, numbered per (op, group size) over the instances and
-- split by side for send/recv; each instance gets its transfer ratio; stragglers.py numbers a
-- step's instances densely (the replay's index) when it reads that step's members, one step at a
-- time, and fills num_instances, last_frac and transfer_ratio from them. Who arrived last at an instance and the
-- waits it imposed come from collperf_instances (last_rank, wait_ns), computed there in one pass.
CREATE OR REPLACE TEMP TABLE _st_instances AS
WITH kinds AS (
    SELECT op, group_size, CAST(row_number() OVER (ORDER BY op, group_size) AS INTEGER) AS kind
    FROM (SELECT DISTINCT op, group_size FROM match_instances WHERE run_id = $run_id AND status = 'complete')
), typical AS (
    SELECT op, bytes, median(transfer_ns) AS transfer_ns FROM collperf_instances
    WHERE run_id = $run_id AND transfer_ns > 0 GROUP BY ALL
), transfer AS (
    -- an instance's transfer against the median of same-op, same-size instances (all groups)
    SELECT c.instance_id, c.transfer_ns / nullif(t.transfer_ns, 0) AS ratio
    FROM collperf_instances c JOIN typical t ON t.op = c.op AND t.bytes IS NOT DISTINCT FROM c.bytes
    WHERE c.run_id = $run_id AND c.transfer_ns > 0
)
SELECT i.instance_id, i.step, i.is_p2p, i.src_rank, k.kind, t.ratio, i.op
FROM match_instances i JOIN kinds k ON k.op = i.op AND k.group_size IS NOT DISTINCT FROM i.group_size
LEFT JOIN transfer t USING (instance_id)
WHERE i.run_id = $run_id AND i.status = 'complete';

INSERT INTO stragglers_ranks
WITH last AS (
    SELECT c.instance_id, c.step, c.last_rank, c.wait_ns AS peers_wait_ns
    FROM collperf_instances c WHERE c.run_id = $run_id AND c.instance_id IN (SELECT instance_id FROM _st_instances)
      AND c.step IN (SELECT step FROM timeline_spans WHERE run_id = $run_id AND step >= 0)
), last_rank AS (
    SELECT last_rank AS rank, count(*) AS num_last FROM last GROUP BY ALL
), imposed AS (
    SELECT last_rank AS rank, step, sum(peers_wait_ns) AS wait_ns FROM last GROUP BY ALL
), imposed_med AS (
    SELECT rank, median(wait_ns) AS wait_ns FROM imposed GROUP BY rank
), bd AS (
    SELECT rank, median(compute_ns + overlapped_comm_ns) AS compute_ns, median(idle_ns + other_ns) AS host_ns
    FROM breakdown_steps WHERE run_id = $run_id AND step >= 0 GROUP BY rank
)
SELECT $run_id, r.rank, r.host, 0, coalesce(l.num_last, 0), NULL,
    CAST(coalesce(i.wait_ns, 0) AS BIGINT), CAST(bd.compute_ns AS BIGINT), CAST(bd.host_ns AS BIGINT), NULL,
    (SELECT median(compute_ns) FROM bd) / nullif(bd.compute_ns, 0),
    NULL, false, NULL, NULL, NULL, NULL
FROM ranks r
LEFT JOIN last_rank l USING (rank) LEFT JOIN imposed_med i USING (rank) LEFT JOIN bd USING (rank)
WHERE r.run_id = $run_id;
