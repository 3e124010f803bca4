-- What does each rank's step consist of, as the what-if replay needs it? The member rows of the
-- collectives (the joins between ranks) and each rank's spans; graph.py builds one chain per rank
-- and step from them and splits the work between collectives into parts (host gaps, kernel classes).
-- Reads match_instances, match_members(_aligned), timeline_spans, ranks, breakdown_groups, whatif_host_members; writes the temp tables _wi_members
-- and _wi_spans (per step, read one step at a time).
--
-- Definitions.
-- * A joined instance: a complete instance (match_instances.status = 'complete') whose every member
--   has an aligned arrival and end: no member leaves before the last one arrives.
-- * A solo instance: one member of any other instance (cut by the window, a mismatch, a rank whose
--   clock offset is unknown, a single-rank trace of a larger job) with its own arrival and end: its
--   peers' arrivals are unknown, so it keeps its measured duration and joins nobody.
-- * Times are aligned (own clock + ranks.clock_offset_ns; + 0 while unknown, for solo members and
--   spans alike, so each rank's chain is on one clock).
-- * role: the collective kind a member plays, numbered per (op, group size), send and recv apart
--   (as the straggler analysis numbers them).
-- * dim: the parallel dimension of the instance's process group (breakdown_groups.dim: tp, dp,
--   fsdp, pp, ...; NULL when the group is not classified).
-- * issue_ns, host_waited: whatif_host_members (host.sql, run first); without a row there, the
--   arrival and true. end_ns: the member's end, or where host.sql found the training thread
--   resumed before its range closed, that resumption.

CREATE OR REPLACE TEMP TABLE _wi_spans AS
SELECT s.rank, s.step, s.ts_ns + coalesce(r.clock_offset_ns, 0) AS start_ns,
    s.ts_ns + s.dur_ns + coalesce(r.clock_offset_ns, 0) AS end_ns, coalesce(r.clock_offset_ns, 0) AS offset_ns,
    s.timeline, s.main_tid
FROM timeline_spans s JOIN ranks r ON r.run_id = s.run_id AND r.rank = s.rank
WHERE s.run_id = $run_id;

CREATE OR REPLACE TEMP TABLE _wi_members AS
WITH joined AS (
    SELECT i.instance_id FROM match_instances i
    WHERE i.run_id = $run_id AND i.status = 'complete' AND i.step IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM match_members_aligned m WHERE m.run_id = $run_id AND m.instance_id = i.instance_id
                      AND (m.arrival_aligned_ns IS NULL OR m.end_aligned_ns IS NULL))
), kinds AS (
    SELECT op, group_size, CAST(row_number() OVER (ORDER BY op, group_size) - 1 AS INTEGER) AS kind
    FROM (SELECT DISTINCT op, group_size FROM match_instances WHERE run_id = $run_id)
), dims AS (
    -- per instance, the dimension of its group: joined on the instances (thousands), not the members
    SELECT i.instance_id, any_value(g.dim) AS dim FROM match_instances i
    JOIN breakdown_groups g ON g.run_id = i.run_id AND g.pg_name IS NOT DISTINCT FROM i.pg_name
         AND g.pg_desc IS NOT DISTINCT FROM i.pg_desc AND g.pg_ranks IS NOT DISTINCT FROM i.pg_ranks
    WHERE i.run_id = $run_id GROUP BY i.instance_id
), rows AS (
    SELECT i.step, m.instance_id, -1 AS solo_rank, m.rank, m.arrival_aligned_ns AS arrival_ns, m.end_aligned_ns AS end_ns,
        i.op, i.bytes, i.group_size, i.is_p2p, i.src_rank, m.call_index
    FROM match_members_aligned m JOIN match_instances i ON i.run_id = m.run_id AND i.instance_id = m.instance_id
    WHERE m.run_id = $run_id AND m.instance_id IN (SELECT instance_id FROM joined)
    UNION ALL
    SELECT m.step, m.instance_id, m.rank AS solo_rank, m.rank, m.arrival_ts_ns + coalesce(r.clock_offset_ns, 0),
        m.end_ts_ns + coalesce(r.clock_offset_ns, 0), i.op, i.bytes, i.group_size, i.is_p2p, i.src_rank, m.call_index
    FROM match_members m JOIN match_instances i ON i.run_id = m.run_id AND i.instance_id = m.instance_id
    JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank
    WHERE m.run_id = $run_id AND m.instance_id NOT IN (SELECT instance_id FROM joined)
      AND m.step IS NOT NULL AND m.arrival_ts_ns IS NOT NULL AND m.end_ts_ns IS NOT NULL
)
SELECT x.step, x.rank, x.arrival_ns, coalesce(h.end_aligned_ns, x.end_ns) AS end_ns, x.instance_id, x.solo_rank,
    coalesce(h.issue_aligned_ns, x.arrival_ns) AS issue_ns, coalesce(h.host_waited, true) AS host_waited,
    CAST(dense_rank() OVER (PARTITION BY x.step ORDER BY x.instance_id, x.solo_rank) - 1 AS BIGINT) AS dense_id,
    x.op, x.bytes, x.group_size, d.dim,
    CAST(2 * k.kind + CASE WHEN x.is_p2p AND x.rank = x.src_rank THEN 1 ELSE 0 END AS INTEGER) AS role_id
FROM rows x JOIN kinds k ON k.op = x.op AND k.group_size IS NOT DISTINCT FROM x.group_size
LEFT JOIN dims d ON d.instance_id = x.instance_id
LEFT JOIN whatif_host_members h ON h.instance_id = x.instance_id AND h.rank = x.rank AND h.call_index = x.call_index
-- a member whose rank has no span in that step cannot be replayed in it: its time stays work
JOIN _wi_spans s ON s.rank = x.rank AND s.step = x.step;
