-- How far is each host's clock from the run's reference clock? The inputs of the offset solver:
-- the clock-sync samples and the exits of matched collectives, per pair of hosts.
-- Reads ranks, clock_samples, match_instances, match_members; writes clock_hosts (through
-- clock.py, which solves the offsets, and clock_apply.sql, which applies them).
--
-- Definitions:
-- * Ranks of one host share a clock; a rank whose host is unknown is its own clock, named
--   'rank <r>'. The reference is the host of the lowest rank: offset 0. aligned = own + offset.
--   No rank is ever shifted to one global minimum timestamp.
-- * A clock sample (bprof record: each host's first rank ping-pongs with global rank 0) gives
--   offset = reference_ns - (send_ns + recv_ns) / 2, wrong by at most half the round trip; the
--   true offset lies in [reference_ns - recv_ns, reference_ns - send_ns].
-- * Exits: every member of a symmetric blocking collective (all_reduce, all_gather,
--   reduce_scatter, barrier) ends at the same true time, give or take transfer jitter: arrivals
--   differ (a straggler arrives late), exits do not. So end(host b) - end(host a) over the
--   instances estimates clock(b) - clock(a). The ends of a send/recv pair are a weaker version of
--   the same fact (NCCL's sender finishes with its receiver; a gloo sender may not): used only where
--   nothing else links two clocks.

CREATE TABLE IF NOT EXISTS clock_hosts (
    run_id INTEGER NOT NULL,
    host VARCHAR NOT NULL,
    ranks INTEGER[] NOT NULL,
    offset_ns BIGINT,
    residual_ns BIGINT,
    method VARCHAR NOT NULL,
    via_host VARCHAR,
    num_samples BIGINT NOT NULL,
    num_collectives BIGINT NOT NULL,
    PRIMARY KEY (run_id, host)
);
COMMENT ON TABLE clock_hosts IS 'One row per clock (host) of a run: its offset to the reference clock, how it was estimated and how good it is.';
COMMENT ON COLUMN clock_hosts.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN clock_hosts.host IS 'Host name (ranks.host); ''rank <r>'' for a rank whose host is unknown, which counts as its own clock.';
COMMENT ON COLUMN clock_hosts.ranks IS 'Global ranks on this clock.';
COMMENT ON COLUMN clock_hosts.offset_ns IS 'Add to a time on this clock to get the reference clock (the host of the lowest rank, offset 0); NULL when nothing links this clock to the reference.';
COMMENT ON COLUMN clock_hosts.residual_ns IS 'Error estimate of offset_ns: half the best round trip of clock samples, or 1.4826 x the median absolute deviation of the collective exits (the spread of one exit), root-sum-squared along the chain of hosts it was derived through.';
COMMENT ON COLUMN clock_hosts.method IS 'reference; samples (clock-sync ping-pongs); exits (symmetric collective exits); samples+exits (exits, checked to lie within the samples'' bounds); p2p_exits (the path uses send/recv exits: nothing better links these clocks); none (not aligned).';
COMMENT ON COLUMN clock_hosts.via_host IS 'The host this offset was derived from (the last hop of its chain); NULL for the reference and unaligned hosts.';
COMMENT ON COLUMN clock_hosts.num_samples IS 'Clock-sync samples this host sent.';
COMMENT ON COLUMN clock_hosts.num_collectives IS 'Matched instances whose exits link this host to another (symmetric collectives and p2p).';

CREATE OR REPLACE TEMP TABLE _clock_domains AS
SELECT rank, coalesce(host, format('rank {}', rank)) AS host FROM ranks WHERE run_id = $run_id;

-- Algorithm: per phase (window start, window end) the sample with the shortest round trip (NTP's
-- choice); the offset is the median of those, its residual the larger of half their worst round
-- trip and half their spread (drift between phases), or, when tighter, its distance to the far end
-- of the bounds: the intersection of every sample's interval (empty when the clocks drifted).
CREATE OR REPLACE TEMP TABLE _clock_sample_edges AS
WITH s AS (
    SELECT d.host AS host, r.host AS ref_host, c.phase, c.recv_ns - c.send_ns AS rtt_ns,
        c.reference_ns - (c.send_ns + c.recv_ns) // 2 AS offset_ns,
        c.reference_ns - c.recv_ns AS lo_ns, c.reference_ns - c.send_ns AS hi_ns
    FROM clock_samples c
    JOIN _clock_domains d ON d.rank = c.rank
    JOIN _clock_domains r ON r.rank = c.reference_rank
    WHERE c.run_id = $run_id AND c.recv_ns >= c.send_ns AND d.host <> r.host
), best AS (
    SELECT host, ref_host, phase, arg_min(offset_ns, rtt_ns) AS offset_ns, min(rtt_ns) AS rtt_ns
    FROM s GROUP BY ALL
), per_pair AS (
    SELECT host, ref_host, CAST(quantile_disc(offset_ns, 0.5) AS BIGINT) AS offset_ns,
        greatest(max(rtt_ns) // 2, (max(offset_ns) - min(offset_ns)) // 2) AS residual_ns
    FROM best GROUP BY ALL
), bounds AS (
    SELECT host, ref_host, max(lo_ns) AS lo_ns, min(hi_ns) AS hi_ns, count(*) AS num_samples FROM s GROUP BY ALL
)
SELECT p.host, p.ref_host, p.offset_ns,
    -- inside every sample's interval, the estimate is off by at most its distance to the far end
    CASE WHEN p.offset_ns BETWEEN b.lo_ns AND b.hi_ns
         THEN least(p.residual_ns, greatest(p.offset_ns - b.lo_ns, b.hi_ns - p.offset_ns))
         ELSE p.residual_ns END AS residual_ns,
    b.lo_ns, b.hi_ns, b.num_samples
FROM per_pair p JOIN bounds b USING (host, ref_host);

-- Algorithm: per instance and host, the median end of its members there (one clock); each host's
-- end minus the end on the host of the instance's lowest rank (the anchor) is one observation of
-- clock(host) - clock(anchor). Per pair: the median observation and the median absolute deviation.
-- Only complete instances with device (or gloo worker) timing whose group spans hosts.
CREATE OR REPLACE TEMP TABLE _clock_exit_edges AS
WITH groups AS (
    SELECT pg_name, any_value(pg_ranks) AS pg_ranks FROM match_instances
    WHERE run_id = $run_id AND NOT is_p2p AND pg_name IS NOT NULL GROUP BY pg_name
), spanning AS (
    -- collective groups with members on more than one clock (or unknown members): only their
    -- exits link clocks, and most calls of a large job (tensor parallel) stay within one host
    SELECT g.pg_name FROM groups g
    LEFT JOIN (SELECT pg_name, unnest(pg_ranks) AS rank FROM groups) u USING (pg_name)
    LEFT JOIN _clock_domains d USING (rank)
    GROUP BY g.pg_name HAVING count(DISTINCT d.host) > 1 OR any_value(g.pg_ranks) IS NULL
), inst AS (
    SELECT i.instance_id, CASE WHEN i.is_p2p THEN 'p2p_exits' ELSE 'exits' END AS kind
    FROM match_instances i
    LEFT JOIN _clock_domains s ON s.rank = i.src_rank
    LEFT JOIN _clock_domains r ON r.rank = i.dst_rank
    WHERE i.run_id = $run_id AND i.status = 'complete' AND i.timing = 'device'
      AND (i.is_p2p AND s.host <> r.host
           OR i.op IN ('all_reduce', 'all_gather', 'reduce_scatter', 'barrier')
              AND (i.pg_name IS NULL OR i.pg_name IN (SELECT pg_name FROM spanning)))
), per_host AS (
    SELECT m.instance_id, i.kind, d.host, min(m.rank) AS first_rank,
        quantile_disc(m.end_ts_ns, 0.5) AS end_ns
    FROM match_members m JOIN inst i USING (instance_id) JOIN _clock_domains d ON d.rank = m.rank
    WHERE m.run_id = $run_id AND m.end_ts_ns IS NOT NULL
    GROUP BY ALL
), anchors AS (
    -- an aggregate and a join: the ordered first() over a window partition cost seconds
    SELECT instance_id, arg_min(host, first_rank) AS anchor, arg_min(end_ns, first_rank) AS anchor_end_ns
    FROM per_host GROUP BY instance_id
), obs AS (
    SELECT p.kind, a.anchor, p.host, p.end_ns - a.anchor_end_ns AS d_ns
    FROM per_host p JOIN anchors a USING (instance_id) WHERE p.host <> a.anchor
), med AS (
    SELECT kind, anchor, host, CAST(round(median(d_ns)) AS BIGINT) AS d_ns, count(*) AS num_obs FROM obs GROUP BY ALL
)
SELECT kind, anchor, host, m.d_ns,
    CAST(round(1.4826 * median(abs(o.d_ns - m.d_ns))) AS BIGINT) AS residual_ns, any_value(num_obs) AS num_obs
FROM med m JOIN obs o USING (kind, anchor, host)
GROUP BY kind, anchor, host, m.d_ns;
