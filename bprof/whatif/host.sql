-- When did each rank's training thread issue its collectives, and did it wait for them to end?
-- The step graph (graph.sql) and the straggler pricing (analyzers/stragglers.py) read it, so that
-- both replay with the same graph. Reads match_members, timeline_spans, collectives, ranks, events;
-- writes the temp table whatif_host_members.
--
-- Only ranks whose timeline is the main thread (CPU runs: the host is the timeline) have rows; a
-- member without a row issues at its arrival and its end may release what follows (a device
-- timeline's chain is the device's, where the host's launch times do not apply).
-- * issue_aligned_ns: collectives.cpu_ts_ns (the call on the training thread), never after the
--   arrival, + the rank's clock offset (0 while unknown, as graph.sql's solo members).
-- * host_waited: no CPU op on the training thread covers the moment $wait_probe_ns before the
--   member's end: the thread was idle, waiting for it (DDP's finalize, a blocking wait()), so what
--   it did next was released by that end. True when the end is unknown.
-- Algorithm: one inequality join of the members' probe instants with the training thread's CPU ops.

CREATE OR REPLACE TEMP TABLE whatif_host_members AS
WITH m AS (
    SELECT m.instance_id, m.rank, m.call_index, m.arrival_ts_ns, m.end_ts_ns, s.main_tid,
        least(c.cpu_ts_ns, m.arrival_ts_ns) + coalesce(r.clock_offset_ns, 0) AS issue_aligned_ns
    FROM match_members m
    JOIN timeline_spans s ON s.run_id = m.run_id AND s.rank = m.rank AND s.step = m.step AND s.timeline = 'main_thread'
    JOIN collectives c ON c.run_id = m.run_id AND c.rank = m.rank AND c.call_index = m.call_index
    JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank
    WHERE m.run_id = $run_id AND c.cpu_ts_ns IS NOT NULL
), busy AS (
    SELECT DISTINCT m.instance_id, m.rank, m.call_index
    FROM m JOIN events e ON e.run_id = $run_id AND e.rank = m.rank AND e.tid = m.main_tid AND e.kind = 'cpu_op'
        AND e.ts_ns < m.end_ts_ns - $wait_probe_ns AND e.ts_ns + e.dur_ns > m.end_ts_ns - $wait_probe_ns
)
SELECT m.instance_id, m.rank, m.call_index, m.issue_aligned_ns, b.rank IS NULL AS host_waited
FROM m LEFT JOIN busy b ON b.instance_id = m.instance_id AND b.rank = m.rank AND b.call_index = m.call_index;
