-- How did each collective perform: how long did its members wait for the last one, how long did
-- the transfer itself take, at what bandwidth? Per complete instance, per member, per group.
-- Reads match_instances, match_members (aligned by the clock analyzer), ranks, collectives;
-- writes collperf_instances, collperf_members, collperf_waits, collperf_groups.
--
-- Definitions (on aligned clocks, match_members.*_aligned_ns):
-- * skew_ns = last arrival - first arrival; last_rank = the member that arrived last.
-- * wait_ns of a member = last arrival - its own arrival: the part of its call spent waiting for
--   peers (the exposed_wait of the analyze partition, once breakdown intersects it with exposed
--   communication through collperf_waits).
-- * transfer_ns = common end - last arrival, the common end being the median of the members' ends.
-- * nccl-tests conventions: algbw = bytes / transfer time, with bytes as match_instances.bytes
--   counts them (all_gather its output, reduce_scatter its input); busbw = algbw x factor:
--   all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n;
--   broadcast, reduce and p2p 1.
-- Only complete instances (match_instances.status) with at least two members, all on aligned
-- clocks; cut, mismatched and unaligned ones are left out.

CREATE TABLE IF NOT EXISTS collperf_instances (
    run_id INTEGER NOT NULL,
    instance_id BIGINT NOT NULL,
    op VARCHAR NOT NULL,
    pg_name VARCHAR,
    pg_desc VARCHAR,
    pg_ranks INTEGER[],
    seq BIGINT,
    is_p2p BOOLEAN NOT NULL,
    step INTEGER,
    num_members INTEGER NOT NULL,
    bytes BIGINT,
    timing VARCHAR NOT NULL,
    first_arrival_aligned_ns BIGINT NOT NULL,
    last_arrival_aligned_ns BIGINT NOT NULL,
    skew_ns BIGINT NOT NULL,
    last_rank INTEGER NOT NULL,
    end_aligned_ns BIGINT,
    transfer_ns BIGINT,
    algbw_bytes_per_s DOUBLE,
    busbw_factor DOUBLE,
    busbw_bytes_per_s DOUBLE,
    spans_hosts BOOLEAN,
    link_peak_bytes_per_s DOUBLE,
    busbw_peak_frac DOUBLE,
    member_bytes_imbalance_frac DOUBLE,
    PRIMARY KEY (run_id, instance_id)
);
COMMENT ON TABLE collperf_instances IS 'One row per complete collective or p2p instance on aligned clocks: arrival skew, transfer time, bandwidth.';
COMMENT ON COLUMN collperf_instances.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN collperf_instances.instance_id IS 'Instance (match_instances.instance_id).';
COMMENT ON COLUMN collperf_instances.op IS 'Canonical op, or p2p for a send/recv pair.';
COMMENT ON COLUMN collperf_instances.pg_name IS 'Process group name.';
COMMENT ON COLUMN collperf_instances.pg_desc IS 'Process group description.';
COMMENT ON COLUMN collperf_instances.pg_ranks IS 'Global ranks of the process group.';
COMMENT ON COLUMN collperf_instances.seq IS 'Sequence number of the instance (match_instances.seq).';
COMMENT ON COLUMN collperf_instances.is_p2p IS 'True for a send/recv pair.';
COMMENT ON COLUMN collperf_instances.step IS 'Profiler step of the instance (match_instances.step).';
COMMENT ON COLUMN collperf_instances.num_members IS 'Members (n of the busbw factor).';
COMMENT ON COLUMN collperf_instances.bytes IS 'Message size by the nccl-tests convention (match_instances.bytes).';
COMMENT ON COLUMN collperf_instances.timing IS 'device (arrivals and ends of device work or gloo worker ranges) or cpu (some arrivals are CPU call starts; no transfer time).';
COMMENT ON COLUMN collperf_instances.first_arrival_aligned_ns IS 'Earliest member arrival, reference clock.';
COMMENT ON COLUMN collperf_instances.last_arrival_aligned_ns IS 'Latest member arrival, reference clock: when the collective could start moving data.';
COMMENT ON COLUMN collperf_instances.skew_ns IS 'Arrival skew: last_arrival_aligned_ns - first_arrival_aligned_ns.';
COMMENT ON COLUMN collperf_instances.last_rank IS 'The member that arrived last (the lowest rank on a tie).';
COMMENT ON COLUMN collperf_instances.end_aligned_ns IS 'Common end: median of the members'' aligned ends; NULL when a member has no end.';
COMMENT ON COLUMN collperf_instances.transfer_ns IS 'end_aligned_ns - last_arrival_aligned_ns: the collective''s own time once everyone had arrived (negative only through clock error).';
COMMENT ON COLUMN collperf_instances.algbw_bytes_per_s IS 'bytes / transfer time (nccl-tests algbw); NULL without a positive transfer time or a size.';
COMMENT ON COLUMN collperf_instances.busbw_factor IS 'nccl-tests bus-bandwidth factor of the op: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n; broadcast, reduce, p2p 1; NULL for others (barrier).';
COMMENT ON COLUMN collperf_instances.busbw_bytes_per_s IS 'algbw_bytes_per_s x busbw_factor (nccl-tests busbw), comparable with the link bandwidth.';
COMMENT ON COLUMN collperf_instances.spans_hosts IS 'Whether the members are on more than one host (inter-host link) or one (intra-host link); NULL when a member''s host is unknown.';
COMMENT ON COLUMN collperf_instances.link_peak_bytes_per_s IS 'Peak bandwidth of the link the instance crosses (NVLink/xGMI within a host, the NIC across hosts); NULL: bprof has no table of link bandwidths yet, and guessing one would make busbw_peak_frac a fiction.';
COMMENT ON COLUMN collperf_instances.busbw_peak_frac IS 'busbw_bytes_per_s / link_peak_bytes_per_s; NULL while the link peak is unknown.';
COMMENT ON COLUMN collperf_instances.member_bytes_imbalance_frac IS 'all_to_all only: 1 - mean / max of the bytes the members receive (out_bytes): 0 when every rank (expert) receives the same, near 1 when one receives almost everything; NULL for other ops or without sizes.';

CREATE TABLE IF NOT EXISTS collperf_members (
    run_id INTEGER NOT NULL,
    instance_id BIGINT NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER,
    arrival_aligned_ns BIGINT NOT NULL,
    wait_ns BIGINT NOT NULL,
    is_last BOOLEAN NOT NULL,
    PRIMARY KEY (run_id, instance_id, rank)
);
COMMENT ON TABLE collperf_members IS 'One row per member of a collperf_instances instance: how long it waited for the last peer.';
COMMENT ON COLUMN collperf_members.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN collperf_members.instance_id IS 'Instance (collperf_instances.instance_id).';
COMMENT ON COLUMN collperf_members.rank IS 'Global rank of the member.';
COMMENT ON COLUMN collperf_members.step IS 'Profiler step of the member''s call on its rank.';
COMMENT ON COLUMN collperf_members.arrival_aligned_ns IS 'Its arrival, reference clock (match_members.arrival_aligned_ns).';
COMMENT ON COLUMN collperf_members.wait_ns IS 'Last arrival - own arrival: time spent waiting for the last peer (0 for the last).';
COMMENT ON COLUMN collperf_members.is_last IS 'True for the instance''s last_rank.';

CREATE TABLE IF NOT EXISTS collperf_waits (
    run_id INTEGER NOT NULL,
    instance_id BIGINT NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER,
    ts_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL
);
COMMENT ON TABLE collperf_waits IS 'Each member''s wait for its last peer as an interval on the member''s OWN clock, for intersection with its timeline (breakdown''s exposed_wait); only waits longer than 0.';
COMMENT ON COLUMN collperf_waits.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN collperf_waits.instance_id IS 'Instance (collperf_instances.instance_id).';
COMMENT ON COLUMN collperf_waits.rank IS 'Global rank of the waiting member.';
COMMENT ON COLUMN collperf_waits.step IS 'Profiler step of its call.';
COMMENT ON COLUMN collperf_waits.ts_ns IS 'Its own arrival (match_members.arrival_ts_ns), own clock.';
COMMENT ON COLUMN collperf_waits.end_ns IS 'The last peer''s arrival converted to this rank''s clock: last_arrival_aligned_ns - ranks.clock_offset_ns.';

CREATE TABLE IF NOT EXISTS collperf_groups (
    run_id INTEGER NOT NULL,
    pg_name VARCHAR,
    pg_desc VARCHAR,
    pg_ranks INTEGER[],
    op VARCHAR NOT NULL,
    size_bucket_bytes BIGINT,
    spans_hosts BOOLEAN,
    num_instances BIGINT NOT NULL,
    median_bytes BIGINT,
    median_skew_ns BIGINT NOT NULL,
    max_skew_ns BIGINT NOT NULL,
    wait_ns BIGINT NOT NULL,
    median_transfer_ns BIGINT,
    transfer_ns BIGINT,
    median_algbw_bytes_per_s DOUBLE,
    median_busbw_bytes_per_s DOUBLE,
    link_peak_bytes_per_s DOUBLE,
    busbw_peak_frac DOUBLE
);
COMMENT ON TABLE collperf_groups IS 'collperf_instances aggregated by process group, op and message-size bucket (join breakdown_groups on pg_name, pg_desc, pg_ranks for the parallel dimension).';
COMMENT ON COLUMN collperf_groups.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN collperf_groups.pg_name IS 'Process group name.';
COMMENT ON COLUMN collperf_groups.pg_desc IS 'Process group description.';
COMMENT ON COLUMN collperf_groups.pg_ranks IS 'Global ranks of the process group.';
COMMENT ON COLUMN collperf_groups.op IS 'Canonical op, or p2p.';
COMMENT ON COLUMN collperf_groups.size_bucket_bytes IS 'Message-size bucket: the power of two at or below bytes; NULL for unknown or zero sizes.';
COMMENT ON COLUMN collperf_groups.spans_hosts IS 'Whether the group''s instances cross hosts (NULL when a host is unknown).';
COMMENT ON COLUMN collperf_groups.num_instances IS 'Instances in the bucket.';
COMMENT ON COLUMN collperf_groups.median_bytes IS 'Median message size (nccl-tests convention).';
COMMENT ON COLUMN collperf_groups.median_skew_ns IS 'Median arrival skew.';
COMMENT ON COLUMN collperf_groups.max_skew_ns IS 'Largest arrival skew.';
COMMENT ON COLUMN collperf_groups.wait_ns IS 'Sum of every member''s wait over the instances (rank-time spent waiting for peers).';
COMMENT ON COLUMN collperf_groups.median_transfer_ns IS 'Median transfer time; NULL without ends.';
COMMENT ON COLUMN collperf_groups.transfer_ns IS 'Sum of transfer times.';
COMMENT ON COLUMN collperf_groups.median_algbw_bytes_per_s IS 'Median algbw.';
COMMENT ON COLUMN collperf_groups.median_busbw_bytes_per_s IS 'Median busbw.';
COMMENT ON COLUMN collperf_groups.link_peak_bytes_per_s IS 'Peak bandwidth of the link; NULL: no link-bandwidth table yet (never guessed).';
COMMENT ON COLUMN collperf_groups.busbw_peak_frac IS 'median_busbw_bytes_per_s / link_peak_bytes_per_s; NULL while the peak is unknown.';

-- Algorithm: one pass over the members of complete instances; instances with a member on an
-- unaligned clock are dropped whole. The median end is taken as an offset from the earliest end
-- so that no epoch-sized nanosecond count goes through a double.
CREATE OR REPLACE TEMP TABLE _collperf_inst AS
WITH mem AS (
    SELECT m.instance_id, m.rank, m.step, m.arrival_aligned_ns, m.end_aligned_ns, r.host,
        c.out_bytes, min(m.end_aligned_ns) OVER (PARTITION BY m.instance_id) AS min_end_ns
    FROM match_members m
    JOIN match_instances i ON i.run_id = m.run_id AND i.instance_id = m.instance_id
    JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank
    LEFT JOIN collectives c ON i.op = 'all_to_all' AND c.run_id = m.run_id AND c.rank = m.rank AND c.call_index = m.call_index
    WHERE m.run_id = $run_id AND i.status = 'complete' AND i.num_members >= 2
), agg AS (
    SELECT instance_id,
        count(*) AS n, count(arrival_aligned_ns) AS n_aligned, count(end_aligned_ns) AS n_ends,
        min(arrival_aligned_ns) AS first_ns, max(arrival_aligned_ns) AS last_ns,
        first(rank ORDER BY arrival_aligned_ns DESC, rank) AS last_rank,
        any_value(min_end_ns) + CAST(round(median(end_aligned_ns - min_end_ns)) AS BIGINT) AS end_ns,
        CASE WHEN bool_and(host IS NOT NULL) THEN count(DISTINCT host) > 1 END AS spans_hosts,
        CASE WHEN max(out_bytes) > 0 THEN 1 - avg(out_bytes) / max(out_bytes) END AS imbalance
    FROM mem GROUP BY instance_id
)
SELECT i.instance_id, i.op, i.pg_name, i.pg_desc, i.pg_ranks, i.seq, i.is_p2p, i.step, i.num_members, i.bytes, i.timing,
    a.first_ns, a.last_ns, a.last_rank, a.spans_hosts, a.imbalance,
    CASE WHEN a.n_ends = a.n THEN a.end_ns END AS end_ns,
    CASE WHEN a.n_ends = a.n THEN a.end_ns - a.last_ns END AS transfer_ns,
    CASE WHEN i.is_p2p OR i.op IN ('broadcast', 'reduce') THEN 1.0
         WHEN i.op = 'all_reduce' THEN 2.0 * (i.num_members - 1) / i.num_members
         WHEN i.op IN ('all_gather', 'reduce_scatter', 'all_to_all', 'gather', 'scatter')
             THEN (i.num_members - 1) / i.num_members END AS factor
FROM agg a JOIN match_instances i ON i.run_id = $run_id AND i.instance_id = a.instance_id
WHERE a.n_aligned = a.n;

INSERT INTO collperf_instances
SELECT $run_id, instance_id, op, pg_name, pg_desc, pg_ranks, seq, is_p2p, step, num_members, bytes, timing,
    first_ns, last_ns, last_ns - first_ns, last_rank, end_ns, transfer_ns,
    CASE WHEN transfer_ns > 0 AND bytes > 0 THEN bytes / (transfer_ns / 1e9) END,
    factor,
    CASE WHEN transfer_ns > 0 AND bytes > 0 THEN bytes / (transfer_ns / 1e9) * factor END,
    spans_hosts, NULL, NULL,
    CASE WHEN op = 'all_to_all' THEN imbalance END
FROM _collperf_inst;

INSERT INTO collperf_members
SELECT $run_id, m.instance_id, m.rank, m.step, m.arrival_aligned_ns, i.last_ns - m.arrival_aligned_ns,
    m.rank = i.last_rank
FROM match_members m JOIN _collperf_inst i USING (instance_id)
WHERE m.run_id = $run_id;

INSERT INTO collperf_waits
SELECT $run_id, m.instance_id, m.rank, m.step, m.arrival_ts_ns, i.last_ns - r.clock_offset_ns
FROM match_members m
JOIN _collperf_inst i USING (instance_id)
JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank
WHERE m.run_id = $run_id AND i.last_ns > m.arrival_aligned_ns;

INSERT INTO collperf_groups
WITH w AS (
    SELECT instance_id, sum(wait_ns) AS wait_ns FROM collperf_members WHERE run_id = $run_id GROUP BY instance_id
)
SELECT $run_id, pg_name, any_value(pg_desc), pg_ranks, op,
    CASE WHEN bytes > 0 THEN CAST(2 ** floor(log2(bytes)) AS BIGINT) END AS size_bucket_bytes,
    bool_or(spans_hosts), count(*), CAST(round(median(bytes)) AS BIGINT),
    CAST(round(median(skew_ns)) AS BIGINT), max(skew_ns), CAST(sum(w.wait_ns) AS BIGINT),
    CAST(round(median(transfer_ns)) AS BIGINT), CAST(sum(transfer_ns) AS BIGINT),
    median(algbw_bytes_per_s), median(busbw_bytes_per_s), NULL, NULL
FROM collperf_instances c JOIN w USING (instance_id)
WHERE c.run_id = $run_id
GROUP BY pg_name, pg_ranks, op, size_bucket_bytes;
