-- When did each rank's training thread issue its collectives, did it wait for them to end, and when
-- did the wait end? The step graph (graph.sql) and the straggler pricing (analyzers/stragglers.py)
-- read it, so that both replay with the same graph. Reads match_members(_aligned), match_instances,
-- timeline_spans, collectives, ranks, events; writes the temp table whatif_host_members.
--
-- Only ranks whose timeline is the main thread (CPU runs: the host is the timeline) have rows; a
-- member without a row issues at its arrival and its end may release what follows (a device
-- timeline's chain is the device's, where the host's launch times do not apply).
-- * issue_aligned_ns: collectives.cpu_ts_ns (the call on the training thread), never after the
--   arrival, + the rank's clock offset (0 while unknown, as graph.sql's solo members).
-- * end_aligned_ns: where the member's recorded end (gloo's worker range) is later than the
--   thread's resumption from waiting for it: the resumption, else NULL (the recorded end stands).
--   A symmetric collective ($symmetric: every member has the result once the last one arrived) is
--   done for all once its first member's range closes; a member whose range closes later while its
--   training thread sat idle at that first end and resumed (its next CPU op) before the range
--   closed, was released by the resumption: its gloo thread closed the range late, starved of a
--   core by the ranks' own work (measured: 3-36 ms after the thread resumed, DDP on 2 CPU ranks of
--   a 2-core host, tests/programs/test_hf_causal_lm.py). Never before the first member's end.
-- * host_waited: no CPU op on the training thread covers the moment $wait_probe_ns before the
--   member's end: the thread was idle, waiting for it (DDP's finalize, a blocking wait()), so what
--   it did next was released by that end. True when the end is unknown, and where end_aligned_ns
--   is set (the thread was idle until it).
-- Algorithm: inequality joins of the members' probe instants with the training thread's CPU ops.

CREATE OR REPLACE TEMP TABLE whatif_host_members AS
WITH m AS (
    SELECT m.instance_id, m.rank, m.call_index, m.arrival_ts_ns, m.end_ts_ns, s.main_tid,
        coalesce(r.clock_offset_ns, 0) AS offset_ns,
        least(c.cpu_ts_ns, m.arrival_ts_ns) + coalesce(r.clock_offset_ns, 0) AS issue_aligned_ns
    FROM match_members m
    JOIN timeline_spans s ON s.run_id = m.run_id AND s.rank = m.rank AND s.step = m.step AND s.timeline = 'main_thread'
    JOIN collectives c ON c.run_id = m.run_id AND c.rank = m.rank AND c.call_index = m.call_index
    JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank
    WHERE m.run_id = $run_id AND c.cpu_ts_ns IS NOT NULL
), first_end AS (
    -- per symmetric instance of those members, its earliest member end on the reference clock
    SELECT a.instance_id, min(a.end_aligned_ns) AS first_end_aligned_ns
    FROM match_members_aligned a JOIN match_instances i ON i.run_id = a.run_id AND i.instance_id = a.instance_id
    WHERE a.run_id = $run_id AND list_contains($symmetric, i.op) AND a.instance_id IN (SELECT instance_id FROM m)
    GROUP BY a.instance_id
), late AS (
    -- members whose range closed after their instance's first member's (first end on their own clock)
    SELECT m.instance_id, m.rank, m.call_index, m.main_tid, m.end_ts_ns, m.offset_ns,
        f.first_end_aligned_ns - m.offset_ns AS first_end_ts_ns
    FROM m JOIN first_end f ON f.instance_id = m.instance_id
    WHERE m.end_ts_ns - (f.first_end_aligned_ns - m.offset_ns) > $wait_probe_ns
), late_busy AS (
    -- ... whose thread was running an op at that first end (not waiting then)
    SELECT DISTINCT l.instance_id, l.rank, l.call_index
    FROM late l JOIN events e ON e.run_id = $run_id AND e.rank = l.rank AND e.tid = l.main_tid AND e.kind = 'cpu_op'
        AND e.ts_ns <= l.first_end_ts_ns AND e.ts_ns + e.dur_ns > l.first_end_ts_ns
), resumed AS (
    -- ... and the thread's first op after the first end, before the member's range closed
    SELECT l.instance_id, l.rank, l.call_index, min(e.ts_ns) + any_value(l.offset_ns) AS resume_aligned_ns
    FROM late l JOIN events e ON e.run_id = $run_id AND e.rank = l.rank AND e.tid = l.main_tid AND e.kind = 'cpu_op'
        AND e.ts_ns >= l.first_end_ts_ns AND e.ts_ns < l.end_ts_ns - $wait_probe_ns
    WHERE NOT EXISTS (SELECT 1 FROM late_busy b WHERE b.instance_id = l.instance_id AND b.rank = l.rank
                      AND b.call_index = l.call_index)
    GROUP BY l.instance_id, l.rank, l.call_index
), busy AS (
    SELECT DISTINCT m.instance_id, m.rank, m.call_index
    FROM m JOIN events e ON e.run_id = $run_id AND e.rank = m.rank AND e.tid = m.main_tid AND e.kind = 'cpu_op'
        AND e.ts_ns < m.end_ts_ns - $wait_probe_ns AND e.ts_ns + e.dur_ns > m.end_ts_ns - $wait_probe_ns
)
SELECT m.instance_id, m.rank, m.call_index, m.issue_aligned_ns, x.resume_aligned_ns AS end_aligned_ns,
    b.rank IS NULL OR x.rank IS NOT NULL AS host_waited
FROM m LEFT JOIN busy b ON b.instance_id = m.instance_id AND b.rank = m.rank AND b.call_index = m.call_index
LEFT JOIN resumed x ON x.instance_id = m.instance_id AND x.rank = m.rank AND x.call_index = m.call_index;
