-- How did each collective perform: how long did its members wait for the last one, how long did
-- the transfer itself take, at what bandwidth? Per complete instance, per member, per group.
-- Reads match_instances, match_members_aligned (the clock analyzer's offsets), ranks, collectives
-- (with the macros of instance_times.sql);
-- writes collperf_instances, collperf_waits, collperf_groups.
--
-- Definitions (on aligned clocks, match_members_aligned.*_aligned_ns):
-- * skew_ns = last arrival - first arrival; last_rank = the member that arrived last.
-- * wait_ns of a member = last arrival - its own arrival: the part of its call spent waiting for
--   peers (the exposed_wait of the analyze partition, once breakdown intersects it with exposed
--   communication through collperf_waits).
-- * transfer_ns = common end - last arrival, the common end being the median of the members' ends
--   (up to 4 members; beyond, their mean without the earliest and the latest end, rounded down;
--   instance_times.sql).
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
    wait_ns BIGINT NOT NULL
);
COMMENT ON TABLE collperf_instances IS 'One row per complete collective or p2p instance on aligned clocks: arrival skew, transfer time, bandwidth.';
COMMENT ON COLUMN collperf_instances.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN collperf_instances.instance_id IS 'Instance (match_instances.instance_id).';
COMMENT ON COLUMN collperf_instances.op IS 'Canonical op, or p2p for a send/recv pair.';
COMMENT ON COLUMN collperf_instances.pg_name IS 'Process group name (its description and ranks: match_instances, collperf_groups).';
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
COMMENT ON COLUMN collperf_instances.end_aligned_ns IS 'Common end of the members'' aligned ends: their median for up to 4 members, beyond that their mean without the earliest and the latest end, rounded down (robust like the median, and cheap at 10k ranks); NULL when a member has no end.';
COMMENT ON COLUMN collperf_instances.transfer_ns IS 'end_aligned_ns - last_arrival_aligned_ns: the collective''s own time once everyone had arrived (negative only through clock error).';
COMMENT ON COLUMN collperf_instances.algbw_bytes_per_s IS 'bytes / transfer time (nccl-tests algbw); NULL without a positive transfer time or a size.';
COMMENT ON COLUMN collperf_instances.busbw_factor IS 'nccl-tests bus-bandwidth factor of the op: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n; broadcast, reduce, p2p 1; NULL for others (barrier).';
COMMENT ON COLUMN collperf_instances.busbw_bytes_per_s IS 'algbw_bytes_per_s x busbw_factor (nccl-tests busbw), comparable with the link bandwidth.';
COMMENT ON COLUMN collperf_instances.spans_hosts IS 'Whether the members are on more than one host (inter-host link) or one (intra-host link); NULL when a member''s host is unknown.';
COMMENT ON COLUMN collperf_instances.link_peak_bytes_per_s IS 'Peak bandwidth per direction of the link the instance crosses: within a host the slowest member device''s NVLink (devices.csv link_bytes_per_s), across hosts the NIC given as bprof analyze --nic-gbps; NULL when unknown (a device without NVLink in the table, a CPU run, no --nic-gbps): never guessed.';
COMMENT ON COLUMN collperf_instances.busbw_peak_frac IS 'busbw_bytes_per_s / link_peak_bytes_per_s; NULL while the link peak is unknown.';
COMMENT ON COLUMN collperf_instances.wait_ns IS 'Sum over the members of their wait for the last peer (last arrival - own arrival): rank-time the instance cost in waiting; each wait is in collperf_waits.';
COMMENT ON COLUMN collperf_instances.member_bytes_imbalance_frac IS 'all_to_all only: 1 - mean / max of the bytes the members receive (out_bytes) or send (in_bytes), whichever is larger: 0 when every rank (expert) receives and sends the same, near 1 when one receives (a MoE dispatch) or sends (the combine) almost everything; NULL for other ops or without sizes.';

CREATE TABLE IF NOT EXISTS collperf_waits (
    run_id INTEGER NOT NULL,
    instance_id BIGINT NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER,
    ts_ns BIGINT NOT NULL,
    end_ns BIGINT NOT NULL
);
COMMENT ON TABLE collperf_waits IS 'Each member''s wait for its last peer as an interval on the member''s OWN clock, for intersection with its timeline (breakdown''s exposed_wait): its wait_ns is end_ns - ts_ns; only waits longer than 0 (the last member, collperf_instances.last_rank, waits 0).';
COMMENT ON COLUMN collperf_waits.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN collperf_waits.instance_id IS 'Instance (collperf_instances.instance_id).';
COMMENT ON COLUMN collperf_waits.rank IS 'Global rank of the waiting member.';
COMMENT ON COLUMN collperf_waits.step IS 'Profiler step of its call.';
COMMENT ON COLUMN collperf_waits.ts_ns IS 'Its own arrival (match_members.arrival_ts_ns), own clock.';
COMMENT ON COLUMN collperf_waits.end_ns IS 'The last peer''s arrival converted to this rank''s clock (last_arrival_aligned_ns - ranks.clock_offset_ns = ts_ns + the member''s wait_ns).';

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
COMMENT ON COLUMN collperf_groups.link_peak_bytes_per_s IS 'Peak bandwidth per direction of the link (as collperf_instances.link_peak_bytes_per_s; the lowest of the group''s instances); NULL when unknown.';
COMMENT ON COLUMN collperf_groups.busbw_peak_frac IS 'median_busbw_bytes_per_s / link_peak_bytes_per_s; NULL while the peak is unknown.';

-- Algorithm: an instance whose members share a clock (one host) has its timing from match, on that
-- clock (match_instances.first_arrival_ts_ns...), plus the clock's offset: at 10,240 ranks that is 41
-- of the 43 million members (tensor-parallel groups within a host), no longer grouped a second time.
-- The others are grouped here from their aligned times, with the same definitions
-- (instance_times.sql). Instances with a member on an unaligned clock are dropped whole.
-- One statement from members to collperf_instances: a temp table of 5.7 million instances between
-- them cost as much to write as the insert.
INSERT INTO collperf_instances
WITH hosts AS (
    SELECT rank, host FROM ranks WHERE run_id = $run_id
), groups AS (
    SELECT pg_name, any_value(pg_ranks) AS pg_ranks FROM match_instances
    WHERE run_id = $run_id AND NOT is_p2p AND status = 'complete' GROUP BY pg_name
), group_hosts AS (
    -- whether a group spans hosts is a property of its ranks, not of each call
    SELECT g.pg_name, CASE WHEN count(u.rank) = count(h.host) THEN count(DISTINCT h.host) > 1 END AS spans_hosts
    FROM groups g
    JOIN (SELECT pg_name, unnest(pg_ranks) AS rank FROM groups) u USING (pg_name)
    LEFT JOIN hosts h USING (rank)
    GROUP BY g.pg_name
), group_links AS (
    -- the group's intra-host link peak is its slowest member's (NULL unless every member's is known)
    SELECT g.pg_name, CASE WHEN count(l.intra_bytes_per_s) = count(u.rank) THEN min(l.intra_bytes_per_s) END AS intra,
        any_value(l.inter_bytes_per_s) AS inter
    FROM groups g
    JOIN (SELECT pg_name, unnest(pg_ranks) AS rank FROM groups) u USING (pg_name)
    LEFT JOIN _collperf_links l USING (rank)
    GROUP BY g.pg_name
), several AS (
    -- the groups and pairs (instance_id >> 36) with instances whose members are not on one clock
    SELECT DISTINCT instance_id >> 36 AS key FROM match_instances
    WHERE run_id = $run_id AND status = 'complete' AND num_members >= 2 AND first_arrival_ts_ns IS NULL
), agg AS (
    SELECT instance_id,
        count(*) AS n, count(arrival_aligned_ns) AS n_aligned, count(end_aligned_ns) AS n_ends,
        min(arrival_aligned_ns) AS first_ns, max(arrival_aligned_ns) AS last_ns,
        max(it_arrival_key(arrival_aligned_ns, rank)) AS last_key,
        sum(arrival_aligned_ns) AS sum_arrival, sum(end_aligned_ns) AS sum_end,
        min(end_aligned_ns) AS min_end, max(end_aligned_ns) AS max_end
    FROM match_members_aligned WHERE run_id = $run_id AND instance_id >> 36 IN (SELECT key FROM several)
    GROUP BY instance_id
), timed AS (
    SELECT instance_id, true AS from_members, first_ns, last_ns, it_last_rank(last_key, last_ns) AS last_rank,
        it_wait_ns(n, last_ns, sum_arrival) AS wait_ns,
        CASE WHEN n_ends = n THEN it_common_end(n_ends, sum_end, min_end, max_end) END AS end_ns
    FROM agg WHERE n_aligned = n
    UNION ALL
    SELECT i.instance_id, false, i.first_arrival_ts_ns + r.clock_offset_ns, i.last_arrival_ts_ns + r.clock_offset_ns,
        i.last_rank, i.wait_ns, i.end_ts_ns + r.clock_offset_ns
    FROM match_instances i JOIN ranks r ON r.run_id = $run_id AND r.rank = i.last_rank
    WHERE i.run_id = $run_id AND i.first_arrival_ts_ns IS NOT NULL AND r.clock_offset_ns IS NOT NULL
), a2a AS (
    -- bytes each member of an all_to_all receives and sends (its tokens, for MoE): a dispatch is uneven
    -- in what the experts receive, the combine that returns the tokens in what they send
    SELECT m.instance_id,
        greatest(CASE WHEN max(c.out_bytes) > 0 THEN 1 - avg(c.out_bytes) / max(c.out_bytes) END,
                 CASE WHEN max(c.in_bytes) > 0 THEN 1 - avg(c.in_bytes) / max(c.in_bytes) END) AS imbalance
    FROM match_members m
    JOIN collectives c ON c.run_id = m.run_id AND c.rank = m.rank AND c.call_index = m.call_index
    WHERE m.run_id = $run_id AND c.op = 'all_to_all'
      AND m.instance_id IN (SELECT instance_id FROM match_instances WHERE run_id = $run_id AND op = 'all_to_all')
    GROUP BY m.instance_id
), inst AS (
    SELECT i.instance_id, i.op, i.pg_name, i.seq, i.is_p2p, i.step, i.num_members, i.bytes, i.timing,
        a.first_ns, a.last_ns, a.last_rank, x.imbalance, a.wait_ns,
        CASE WHEN i.is_p2p THEN CASE WHEN s.host IS NOT NULL AND d.host IS NOT NULL THEN s.host <> d.host END
             ELSE g.spans_hosts END AS spans_hosts,
        CASE WHEN i.is_p2p THEN least(ls.intra_bytes_per_s, ld.intra_bytes_per_s) ELSE gl.intra END AS intra_bytes_per_s,
        CASE WHEN i.is_p2p THEN ls.inter_bytes_per_s ELSE gl.inter END AS inter_bytes_per_s,
        a.end_ns, a.end_ns - a.last_ns AS transfer_ns,
        CASE WHEN i.is_p2p OR i.op IN ('broadcast', 'reduce') THEN 1.0
             WHEN i.op = 'all_reduce' THEN 2.0 * (i.num_members - 1) / i.num_members
             WHEN i.op IN ('all_gather', 'reduce_scatter', 'all_to_all', 'gather', 'scatter')
                 THEN (i.num_members - 1) / i.num_members END AS factor
    FROM timed a
    JOIN match_instances i ON i.run_id = $run_id AND i.instance_id = a.instance_id
    LEFT JOIN a2a x ON x.instance_id = a.instance_id
    LEFT JOIN group_hosts g ON g.pg_name = i.pg_name AND NOT i.is_p2p
    LEFT JOIN group_links gl ON gl.pg_name = i.pg_name AND NOT i.is_p2p
    LEFT JOIN hosts s ON s.rank = i.src_rank
    LEFT JOIN hosts d ON d.rank = i.dst_rank
    LEFT JOIN _collperf_links ls ON ls.rank = i.src_rank
    LEFT JOIN _collperf_links ld ON ld.rank = i.dst_rank
    WHERE i.status = 'complete' AND i.num_members >= 2 AND a.from_members = (i.first_arrival_ts_ns IS NULL)
)
SELECT $run_id, instance_id, op, pg_name, seq, is_p2p, step, num_members, bytes, timing,
    first_ns, last_ns, last_ns - first_ns, last_rank, end_ns, transfer_ns,
    CASE WHEN transfer_ns > 0 AND bytes > 0 THEN bytes / (transfer_ns / 1e9) END,
    factor,
    CASE WHEN transfer_ns > 0 AND bytes > 0 THEN bytes / (transfer_ns / 1e9) * factor END,
    spans_hosts, link_peak, CASE WHEN transfer_ns > 0 AND bytes > 0 THEN bytes / (transfer_ns / 1e9) * factor / link_peak END,
    CASE WHEN op = 'all_to_all' THEN imbalance END, wait_ns
FROM (SELECT *, CASE spans_hosts WHEN true THEN inter_bytes_per_s WHEN false THEN intra_bytes_per_s END AS link_peak
      FROM inst);

-- The wait on the member's own clock: from its own arrival for as long as it waited (the
-- offset cancels: last_arrival_aligned - offset = own arrival + wait).
INSERT INTO collperf_waits
SELECT $run_id, m.instance_id, m.rank, m.step, m.arrival_ts_ns, m.arrival_ts_ns + (i.last_arrival_aligned_ns - m.arrival_aligned_ns)
FROM match_members_aligned m JOIN collperf_instances i ON i.run_id = $run_id AND i.instance_id = m.instance_id
WHERE m.run_id = $run_id AND i.last_arrival_aligned_ns > m.arrival_aligned_ns;

INSERT INTO collperf_groups
WITH g AS (
    SELECT pg_name, any_value(pg_desc) AS pg_desc, any_value(pg_ranks) AS pg_ranks
    FROM match_instances WHERE run_id = $run_id AND status = 'complete' GROUP BY pg_name
), agg AS (
    SELECT pg_name, op, CASE WHEN bytes > 0 THEN CAST(2 ** floor(log2(bytes)) AS BIGINT) END AS size_bucket_bytes,
        bool_or(spans_hosts) AS spans_hosts, count(*) AS n, CAST(round(median(bytes)) AS BIGINT) AS bytes,
        CAST(round(median(skew_ns)) AS BIGINT) AS skew_ns, max(skew_ns) AS max_skew_ns, CAST(sum(wait_ns) AS BIGINT) AS wait_ns,
        CAST(round(median(transfer_ns)) AS BIGINT) AS transfer_ns, CAST(sum(transfer_ns) AS BIGINT) AS sum_transfer_ns,
        median(algbw_bytes_per_s) AS algbw, median(busbw_bytes_per_s) AS busbw,
        min(link_peak_bytes_per_s) AS link_peak
    FROM collperf_instances WHERE run_id = $run_id
    GROUP BY pg_name, op, size_bucket_bytes
)
SELECT $run_id, a.pg_name, g.pg_desc, g.pg_ranks, a.op, a.size_bucket_bytes, a.spans_hosts, a.n, a.bytes,
    a.skew_ns, a.max_skew_ns, a.wait_ns, a.transfer_ns, a.sum_transfer_ns, a.algbw, a.busbw, a.link_peak,
    a.busbw / a.link_peak
FROM agg a LEFT JOIN g ON g.pg_name IS NOT DISTINCT FROM a.pg_name;
