-- Which calls of different ranks are one collective or p2p instance, and which instances do not
-- match (a member missing, a different op, size or dtype)? The first step towards a hang diagnosis,
-- and the input of clock alignment and collective performance.
-- Reads collectives, steps, ranks; writes match_instances, match_members (and the view
-- match_members_aligned over it), match_nameless_steps.
--
-- Definitions:
-- * Group identity: pg_name, the same on every rank (torch names groups by a global creation
--   counter); pg_ranks for calls whose group has no name. Ranks alone would merge two process
--   groups over the same ranks (Megatron's DP group and DP-with-CP group at cp=1, a gloo twin of
--   an NCCL group), whose calls count separate sequence numbers and would collide.
-- * Calls with neither (older torch, or a trace without record_param_comms group arguments, and
--   no single pg_config group to imply one): the group is inferred from the call sequences, step
--   by step (match_nameless_steps). Every member of a group makes the same calls in the same order
--   (op, compared size, dtype), so when every rank that traced a step made the same sequence of
--   such calls in it (and a traced group size, if any, is their number), those ranks are one group:
--   the world of a job with one process group, the DLRM case. Its k-th call in the step on each rank
--   is one instance (match_instances.group_from = 'sequence'). Where the sequences disagree (a rank
--   with other calls, or none) the step's calls are not matched at all, never merged: which ranks
--   form which group cannot be told, and match_nameless_steps.reason says why. Subgroups cannot be
--   inferred this way (the TP groups of a symmetric job all make the same sequence as the world).
-- * A collective instance is (group, seq); a p2p instance is (group, sender, receiver, seq). The
--   peer of a send/recv is collectives.peer_rank, else the other rank of a two-rank group.
--   Without seq, the k-th call of the group (of the pair, for p2p) in a step on each rank.
-- * A member's arrival is the start of its device work (first NCCL kernel, gloo worker range),
--   else of its CPU call; its end is the end of that device work (NULL without device work: the
--   end of an asynchronous CPU call is when it was enqueued, not when it finished).
-- * Expected members: the group's ranks (the ranks seen calling on the group when pg_ranks is
--   unknown); for p2p, the sender and the receiver.
-- * One clock: the expected members are on one host (a rank whose host is unknown is its own
--   clock, as the clock analyzer counts them). Such an instance's timing (first and last arrival,
--   the last rank, the members' wait, the common end; instance_times.sql) is exact on their own
--   clock and kept here; collperf adds the host's offset instead of aggregating its members again.

CREATE TABLE IF NOT EXISTS match_instances (
    run_id INTEGER NOT NULL,
    instance_id BIGINT NOT NULL,
    op VARCHAR NOT NULL,
    pg_name VARCHAR,
    pg_desc VARCHAR,
    pg_ranks INTEGER[],
    group_size INTEGER,
    seq BIGINT,
    src_rank INTEGER,
    dst_rank INTEGER,
    step INTEGER,
    is_p2p BOOLEAN NOT NULL,
    num_members INTEGER NOT NULL,
    num_expected INTEGER,
    missing_ranks INTEGER[],
    cut_ranks INTEGER[],
    status VARCHAR NOT NULL,
    reason VARCHAR,
    dtype VARCHAR,
    bytes BIGINT,
    timing VARCHAR NOT NULL,
    first_arrival_ts_ns BIGINT,
    last_arrival_ts_ns BIGINT,
    last_rank INTEGER,
    wait_ns BIGINT,
    end_ts_ns BIGINT,
    group_from VARCHAR
);
-- stores analysed before the column existed: added at the end, where the INSERT below writes it
ALTER TABLE match_instances ADD COLUMN IF NOT EXISTS group_from VARCHAR;
COMMENT ON TABLE match_instances IS 'One row per collective or p2p instance: the calls of its members matched by group and sequence number.';
COMMENT ON COLUMN match_instances.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN match_instances.instance_id IS 'Instance key within the run: the group (or sender-receiver pair) and sequence number packed into one integer, so each member carries it without a join (ordered by group, then seq); instance_id >> 36 is the same for every instance of a group (of a pair).';
COMMENT ON COLUMN match_instances.op IS 'Canonical op of the collective (collectives.op), p2p for a send/recv pair, or the first in name order when members disagree.';
COMMENT ON COLUMN match_instances.pg_name IS 'Process group name.';
COMMENT ON COLUMN match_instances.pg_desc IS 'Process group description (of a member that traced one).';
COMMENT ON COLUMN match_instances.pg_ranks IS 'Global ranks of the process group, when traced (NULL for an inferred group: its ranks are match_nameless_steps.ranks).';
COMMENT ON COLUMN match_instances.group_size IS 'Number of ranks in the process group (traced, or of an inferred group the ranks it was inferred from).';
COMMENT ON COLUMN match_instances.seq IS 'Sequence number the members share (per group; for p2p the Seq torch writes, which is the group''s collective counter, or per sender-receiver pair under bprof record); NULL when there is none (calls matched by order within the step).';
COMMENT ON COLUMN match_instances.src_rank IS 'p2p: the sending rank; NULL for collectives.';
COMMENT ON COLUMN match_instances.dst_rank IS 'p2p: the receiving rank; NULL for collectives.';
COMMENT ON COLUMN match_instances.step IS 'Profiler step of the members (the earliest when they differ); NULL when no member call lies in a step.';
COMMENT ON COLUMN match_instances.is_p2p IS 'True for a send/recv pair.';
COMMENT ON COLUMN match_instances.num_members IS 'Calls matched into the instance (one per rank when it is complete).';
COMMENT ON COLUMN match_instances.num_expected IS 'Ranks expected: the group''s ranks, or sender and receiver for p2p.';
COMMENT ON COLUMN match_instances.missing_ranks IS 'Expected ranks with no matching call although the instance lies within the steps they traced (a mismatch); empty when none.';
COMMENT ON COLUMN match_instances.cut_ranks IS 'Expected ranks with no matching call because the instance lies outside what they traced (outside their steps, or no trace): the instance is cut by the window; empty when none.';
COMMENT ON COLUMN match_instances.status IS 'complete (every expected rank, once, same op, size and dtype); cut (members missing only because the call lies outside the steps a missing rank traced, or that rank has no trace: left out of everything downstream); mismatch (a member missing within the steps every member traced, or members differing in op, size or dtype, or a rank calling twice); unknown (a send or recv whose peer is not known).';
COMMENT ON COLUMN match_instances.reason IS 'Why the instance is not complete, in words; NULL when complete.';
COMMENT ON COLUMN match_instances.dtype IS 'Element type as traced (of a member that traced one).';
COMMENT ON COLUMN match_instances.bytes IS 'Message size as nccl-tests counts it: all_gather and gather its output, reduce_scatter and scatter its input, all_reduce, broadcast, reduce and p2p the message, all_to_all the mean bytes a member sends; NULL when not traced (barrier: 0).';
COMMENT ON COLUMN match_instances.timing IS 'device when every member has device (or gloo worker) timing, else cpu (some arrivals are CPU call starts, and ends are unknown).';
COMMENT ON COLUMN match_instances.first_arrival_ts_ns IS 'Earliest member arrival on the members'' shared clock; NULL when they are not on one clock (hosts differ: collperf_instances has it on aligned clocks) or an arrival is unknown.';
COMMENT ON COLUMN match_instances.last_arrival_ts_ns IS 'Latest member arrival on the members'' shared clock; NULL as first_arrival_ts_ns.';
COMMENT ON COLUMN match_instances.last_rank IS 'The member that arrived last (the lowest rank on a tie), on the members'' shared clock; NULL as first_arrival_ts_ns.';
COMMENT ON COLUMN match_instances.wait_ns IS 'Sum over the members of last_arrival_ts_ns - own arrival: rank-time spent waiting for the last peer; NULL as first_arrival_ts_ns.';
COMMENT ON COLUMN match_instances.group_from IS 'How the group was identified: pg_name, pg_ranks (traced without a name), or sequence (no group traced: inferred from the call sequences, which agree on every rank that traced the step; match_nameless_steps).';
COMMENT ON COLUMN match_instances.end_ts_ns IS 'Common end of the members'' device work on their shared clock (median up to 4 members, beyond that the mean without the earliest and latest end); NULL as first_arrival_ts_ns, or when a member has no end.';

CREATE TABLE IF NOT EXISTS match_members (
    run_id INTEGER NOT NULL,
    instance_id BIGINT NOT NULL,
    rank INTEGER NOT NULL,
    call_index INTEGER NOT NULL,
    step INTEGER,
    arrival_ts_ns BIGINT,
    end_ts_ns BIGINT
);
COMMENT ON TABLE match_members IS 'One row per call matched into an instance (collectives row of a member).';
COMMENT ON COLUMN match_members.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN match_members.instance_id IS 'Instance (match_instances.instance_id).';
COMMENT ON COLUMN match_members.rank IS 'Global rank of the member.';
COMMENT ON COLUMN match_members.call_index IS 'The call (collectives.call_index on that rank).';
COMMENT ON COLUMN match_members.step IS 'Profiler step of the call on this rank.';
COMMENT ON COLUMN match_members.arrival_ts_ns IS 'When the member joined: start of its device work (first NCCL kernel, gloo worker range), else of its CPU call; own clock.';
COMMENT ON COLUMN match_members.end_ts_ns IS 'End of its device work (last NCCL kernel or gloo range); own clock; NULL without device work.';

-- The members on the reference clock: aligned = own + the rank's clock offset, which the clock
-- analyzer stores once per rank (ranks.clock_offset_ns) rather than once per member: writing two
-- more columns of every member (43 million rows at 10,240 ranks) cost more than adding the offset
-- wherever aligned times are read.
CREATE OR REPLACE VIEW match_members_aligned AS
SELECT m.*, m.arrival_ts_ns + r.clock_offset_ns AS arrival_aligned_ns, m.end_ts_ns + r.clock_offset_ns AS end_aligned_ns
FROM match_members m LEFT JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank;
COMMENT ON VIEW match_members_aligned IS 'match_members with each member''s times on the reference clock (the clock analyzer''s offsets).';
COMMENT ON COLUMN match_members_aligned.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN match_members_aligned.instance_id IS 'Instance (match_instances.instance_id).';
COMMENT ON COLUMN match_members_aligned.rank IS 'Global rank of the member.';
COMMENT ON COLUMN match_members_aligned.call_index IS 'The call (collectives.call_index on that rank).';
COMMENT ON COLUMN match_members_aligned.step IS 'Profiler step of the call on this rank.';
COMMENT ON COLUMN match_members_aligned.arrival_ts_ns IS 'match_members.arrival_ts_ns: own clock.';
COMMENT ON COLUMN match_members_aligned.end_ts_ns IS 'match_members.end_ts_ns: own clock.';
COMMENT ON COLUMN match_members_aligned.arrival_aligned_ns IS 'arrival_ts_ns + the rank''s clock offset (ranks.clock_offset_ns): on the reference clock; NULL while the offset is unknown (clock not run, or the host not linked to the reference).';
COMMENT ON COLUMN match_members_aligned.end_aligned_ns IS 'end_ts_ns + the rank''s clock offset; NULL without device work or offset.';

CREATE TABLE IF NOT EXISTS match_nameless_steps (
    run_id INTEGER NOT NULL,
    step INTEGER,
    ranks INTEGER[] NOT NULL,
    num_calls BIGINT NOT NULL,
    inferred BOOLEAN NOT NULL,
    reason VARCHAR
);
COMMENT ON TABLE match_nameless_steps IS 'One row per step with collective calls that name no process group (neither name nor ranks): whether their group was inferred from the call sequences.';
COMMENT ON COLUMN match_nameless_steps.run_id IS 'Run (runs.run_id).';
COMMENT ON COLUMN match_nameless_steps.step IS 'Profiler step; NULL for the calls outside every step.';
COMMENT ON COLUMN match_nameless_steps.ranks IS 'The ranks that traced the step (that made such calls, for the calls outside every step): the inferred group''s members when inferred.';
COMMENT ON COLUMN match_nameless_steps.num_calls IS 'Calls without a process group in the step, over all ranks.';
COMMENT ON COLUMN match_nameless_steps.inferred IS 'True when every rank of ranks made the same sequence of such calls (op, compared size, dtype, in order), two ranks at least, and a traced group size, if any, is their number: the calls are matched as one group (match_instances.group_from = sequence). False: none of the step''s such calls is matched.';
COMMENT ON COLUMN match_nameless_steps.reason IS 'Why the group was not inferred, in words; NULL when inferred.';

-- The size the members of an instance must agree on (NULL: not compared; all_to_all splits differ).
CREATE OR REPLACE TEMP MACRO _match_cmp_elems(op, in_elems, out_elems) AS CASE
    WHEN op IN ('all_reduce', 'broadcast', 'reduce', 'all_gather', 'gather', 'send', 'recv') THEN in_elems
    WHEN op IN ('reduce_scatter', 'scatter') THEN coalesce(out_elems, in_elems) END;

-- Algorithm: per step and rank, one hash of the ordered (op, compared size, dtype) of its calls
-- without a group; a step's group is inferred when its ranks have one hash between them.
INSERT INTO match_nameless_steps
WITH calls AS (
    SELECT step, rank, len(calls) AS num_calls, hash(calls) AS sig, calls, min_size, max_size
    FROM (SELECT step, rank, min(group_size) AS min_size, max(group_size) AS max_size,
              list(concat_ws(' ', op, CAST(_match_cmp_elems(op, in_elems, out_elems) AS VARCHAR),
                             lower(regexp_replace(dtype, '^c10::', ''))) ORDER BY call_index) AS calls
          FROM collectives
          WHERE run_id = $run_id AND pg_name IS NULL AND pg_ranks IS NULL AND NOT is_p2p
          GROUP BY step, rank)
), traced AS (
    -- the ranks that traced each step with such calls (a rank with none of them is not its peers' group)
    SELECT DISTINCT s.step, s.rank FROM steps s
    WHERE s.run_id = $run_id AND s.step IN (SELECT step FROM calls)
    UNION SELECT step, rank FROM calls
), per_rank AS (
    SELECT t.step, t.rank, c.sig, c.calls, coalesce(c.num_calls, 0) AS num_calls, c.min_size, c.max_size
    FROM traced t LEFT JOIN calls c ON c.step IS NOT DISTINCT FROM t.step AND c.rank = t.rank
), classes AS (
    SELECT step, sig, list(rank ORDER BY rank) AS ranks, any_value(calls) AS calls FROM per_rank GROUP BY step, sig
), majority AS (
    -- the sequence most ranks made (the lowest ranks on a tie): the others are told against it
    SELECT step, calls AS major FROM classes WHERE sig IS NOT NULL
    QUALIFY row_number() OVER (PARTITION BY step ORDER BY len(ranks) DESC, ranks) = 1
), differ AS (
    -- each sequence's first call (1-based) that differs from the majority's
    SELECT c.*, m.major, list_position(list_transform(range(1, greatest(len(c.calls), len(m.major)) + 1),
                                                     lambda i: c.calls[i] IS DISTINCT FROM m.major[i]), true) AS at
    FROM classes c JOIN majority m ON m.step IS NOT DISTINCT FROM c.step
    WHERE c.sig IS NOT NULL
), judged AS (
    SELECT p.step, list(p.rank ORDER BY p.rank) AS ranks, sum(p.num_calls) AS num_calls,
        count(DISTINCT p.sig) AS num_sigs, list(p.rank ORDER BY p.rank) FILTER (WHERE p.sig IS NULL) AS silent,
        min(p.min_size) AS min_size, max(p.max_size) AS max_size,
        (SELECT string_agg(format('call {} of the step is {} on ranks {}, {} on ranks {}', d.at,
                                  coalesce(d.major[d.at], 'none'), (SELECT list(q.ranks) FROM classes q WHERE q.step IS NOT DISTINCT FROM d.step AND q.calls = d.major)[1],
                                  coalesce(d.calls[d.at], 'none'), d.ranks), '; ' ORDER BY d.ranks)
         FROM differ d WHERE d.step IS NOT DISTINCT FROM p.step AND d.at IS NOT NULL) AS sequences
    FROM per_rank p GROUP BY p.step
)
SELECT $run_id, step, ranks, num_calls,
    num_sigs = 1 AND silent IS NULL AND len(ranks) >= 2 AND (min_size IS NULL OR min_size = max_size AND max_size = len(ranks)),
    nullif(concat_ws('; ',
        CASE WHEN len(ranks) < 2 THEN format('only rank {} makes them', ranks[1]) END,
        CASE WHEN silent IS NOT NULL THEN format('ranks {} traced the step but made none of them', silent) END,
        CASE WHEN num_sigs > 1 THEN format('the ranks'' sequences of (op, elements compared, dtype) disagree: {}', sequences) END,
        CASE WHEN num_sigs = 1 AND silent IS NULL AND len(ranks) >= 2 AND min_size IS NOT NULL
                  AND NOT (min_size = max_size AND max_size = len(ranks))
             THEN format('the traced group size {} is not the {} ranks making them: they belong to smaller groups that cannot be told apart',
                         CASE WHEN min_size = max_size THEN CAST(min_size AS VARCHAR) ELSE format('{}-{}', min_size, max_size) END,
                         len(ranks)) END), '')
FROM judged;

-- The groups of the run: identity, expected members, and the pair of a two-rank group.
CREATE OR REPLACE TEMP TABLE _match_groups AS
WITH g AS (
    -- named and unnamed groups apart: a list in the grouping key of every call cost seconds
    SELECT pg_name, NULL::INTEGER[] AS unnamed_ranks, NULL::INTEGER[] AS inferred_ranks,
        any_value(pg_desc) AS pg_desc, any_value(pg_ranks) AS pg_ranks, max(group_size) AS group_size
    FROM collectives
    WHERE run_id = $run_id AND pg_name IS NOT NULL
    GROUP BY pg_name
    UNION ALL
    SELECT NULL, pg_ranks, NULL, any_value(pg_desc), pg_ranks, max(group_size)
    FROM collectives
    WHERE run_id = $run_id AND pg_name IS NULL AND pg_ranks IS NOT NULL
    GROUP BY pg_ranks
    UNION ALL
    -- inferred groups, numbered after the traced ones (whose numbers do not change)
    SELECT NULL, NULL, ranks, NULL, NULL, len(ranks)
    FROM (SELECT DISTINCT ranks FROM match_nameless_steps WHERE run_id = $run_id AND inferred)
), seen AS (
    -- ranks calling on a group whose ranks were not traced: its expected members
    SELECT pg_name, list(DISTINCT rank ORDER BY rank) AS ranks FROM collectives
    WHERE run_id = $run_id AND pg_name IN (SELECT pg_name FROM g WHERE pg_ranks IS NULL)
    GROUP BY pg_name
), e AS (
    SELECT CAST(row_number() OVER (ORDER BY g.inferred_ranks IS NOT NULL, g.pg_name NULLS LAST, g.unnamed_ranks,
                                         g.inferred_ranks) AS BIGINT) AS gid, g.*,
        coalesce(list_sort(g.pg_ranks), s.ranks, g.inferred_ranks) AS expected
    FROM g LEFT JOIN seen s USING (pg_name)
), clocks AS (
    -- whether the expected ranks share one clock: one host (a rank without one is its own clock)
    SELECT u.gid, count(DISTINCT coalesce(r.host, format('rank {}', u.rank))) = 1 AS one_clock
    FROM (SELECT gid, unnest(expected) AS rank FROM e) u
    LEFT JOIN ranks r ON r.run_id = $run_id AND r.rank = u.rank
    GROUP BY u.gid
)
SELECT e.*,
    CASE WHEN len(expected) = 2 THEN expected[1] END AS pair_lo,
    CASE WHEN len(expected) = 2 THEN expected[2] END AS pair_hi,
    list_reduce(list_transform(expected, lambda r: hash(r)), lambda a, b: xor(a, b)) AS expected_xor,
    coalesce(c.one_clock, false) AS one_clock
FROM e LEFT JOIN clocks c USING (gid);

-- The steps whose calls without a group were inferred one, with that group (a few rows: calls join
-- it on their step, never on a list of ranks).
CREATE OR REPLACE TEMP TABLE _match_inferred_steps AS
SELECT n.step, g.gid, g.pair_lo, g.pair_hi
FROM match_nameless_steps n JOIN _match_groups g ON g.inferred_ranks = n.ranks
WHERE n.run_id = $run_id AND n.inferred;

-- Every call of run `rid` with its group, sender and receiver (p2p) and match number k:
-- * a call with a seq that numbers its instances: that seq (collectives; send/recv when no rank
--   has two calls of one group, direction and peer with the same seq: bprof record's per-pair
--   message numbers);
-- * any other call: 2^35 | slot << nth_bits | nth, nth being its place among the calls of its
--   group (pair) on its rank with the same step and seq, slot the place of that (step, seq) among
--   the run's (_match_slots). This numbers send/recv under torch's Seq, which is the group's
--   collective counter + 1, the same for every message until the next collective, and calls
--   without a seq by their order within the step. The bits go to slot and nth as the run needs
--   them, so k stays below 2^36 whatever the step numbers and sequence numbers.
-- Every operand is BIGINT from the start: DuckDB checks INTEGER shifts, and raised on the first
-- call outside every step (524287 << 16).
-- a variable, not a one-row table: a subquery in the macro's filters costs twice the memory
SET VARIABLE match_p2p_seq_numbers = (
    SELECT count(*) = 0 FROM (
        SELECT 1 FROM collectives WHERE run_id = $run_id AND is_p2p AND seq IS NOT NULL
        GROUP BY rank, pg_name, pg_ranks, op, peer_rank, seq HAVING count(*) > 1));

CREATE OR REPLACE TEMP TABLE _match_slots AS
SELECT step, seq, CAST(row_number() OVER (ORDER BY step NULLS FIRST, seq NULLS FIRST) AS BIGINT) AS slot
FROM (SELECT DISTINCT step, seq FROM collectives
      WHERE run_id = $run_id AND (seq IS NULL OR is_p2p AND NOT getvariable('match_p2p_seq_numbers')));

CREATE OR REPLACE TEMP TABLE _match_slot_bits AS
SELECT CAST(35 - length(bin(count(*))) AS BIGINT) AS nth_bits FROM _match_slots;

CREATE OR REPLACE TEMP MACRO _match_base(rid) AS TABLE
WITH c AS (
    SELECT c.*, g.gid, g.pair_lo, g.pair_hi FROM collectives c JOIN _match_groups g ON g.pg_name = c.pg_name
    WHERE c.run_id = rid
    UNION ALL
    SELECT c.*, g.gid, g.pair_lo, g.pair_hi FROM collectives c JOIN _match_groups g ON g.unnamed_ranks = c.pg_ranks
    WHERE c.run_id = rid AND c.pg_name IS NULL AND g.pg_name IS NULL
    UNION ALL
    SELECT c.*, g.gid, g.pair_lo, g.pair_hi FROM collectives c
    JOIN _match_inferred_steps g ON g.step IS NOT DISTINCT FROM c.step
    WHERE c.run_id = rid AND c.pg_name IS NULL AND c.pg_ranks IS NULL AND NOT c.is_p2p
), k AS (
    SELECT rank, call_index, op, is_p2p, seq, step, dtype, in_elems, in_bytes, out_bytes, gid,
        coalesce(device_ts_ns, cpu_ts_ns) AS arrival_ts_ns, device_ts_ns + device_dur_ns AS end_ts_ns,
        device_ts_ns IS NOT NULL AS on_device,
        CASE WHEN NOT is_p2p THEN NULL WHEN op = 'send' THEN rank
             ELSE coalesce(peer_rank, CASE rank WHEN pair_lo THEN pair_hi WHEN pair_hi THEN pair_lo END) END AS src_rank,
        CASE WHEN NOT is_p2p THEN NULL WHEN op = 'recv' THEN rank
             ELSE coalesce(peer_rank, CASE rank WHEN pair_lo THEN pair_hi WHEN pair_hi THEN pair_lo END) END AS dst_rank,
        _match_cmp_elems(op, in_elems, out_elems) AS cmp_elems
    FROM c
)
SELECT *, seq AS k FROM k WHERE seq IS NOT NULL AND (NOT is_p2p OR getvariable('match_p2p_seq_numbers'))
UNION ALL
SELECT * EXCLUDE (slot, nth, nth_bits),
    CASE WHEN nth >= (1::BIGINT << nth_bits)
         THEN error('match: too many calls of one group in one step, and too many steps, to number them without sequence numbers')
         ELSE (1::BIGINT << 35) | (slot << nth_bits) | nth END AS k
FROM (
    SELECT k.*, s.slot, b.nth_bits,
        CAST(row_number() OVER (PARTITION BY k.rank, k.gid, k.src_rank, k.dst_rank, k.step, k.seq
                                ORDER BY k.call_index) AS BIGINT) AS nth
    FROM k JOIN _match_slots s ON s.step IS NOT DISTINCT FROM k.step AND s.seq IS NOT DISTINCT FROM k.seq
    CROSS JOIN _match_slot_bits b
    WHERE k.seq IS NULL OR k.is_p2p AND NOT getvariable('match_p2p_seq_numbers')
);

CREATE OR REPLACE TEMP TABLE _match_pairs AS
SELECT CAST(row_number() OVER (ORDER BY p.gid, p.src_rank, p.dst_rank) AS BIGINT) AS pair_id, p.gid, p.src_rank, p.dst_rank,
    coalesce(p.src_rank = p.dst_rank OR s.host = d.host, false) AS one_clock
FROM (SELECT DISTINCT gid, src_rank, dst_rank FROM _match_base($run_id) WHERE is_p2p) p
LEFT JOIN ranks s ON s.run_id = $run_id AND s.rank = p.src_rank
LEFT JOIN ranks d ON d.run_id = $run_id AND d.rank = p.dst_rank;

-- instance_id packs the match key into one BIGINT, so that a call finds its instance without a
-- join: collectives gid << 36 | k, p2p 2^62 | pair << 36 | k (each below 2^26, k below 2^36;
-- a seq below 2^35, where the keys of calls without one begin).
CREATE OR REPLACE TEMP MACRO _match_calls(rid) AS TABLE
SELECT b.*,
    CASE WHEN b.k < 0 OR b.k >= (1::BIGINT << 36) OR (b.k = b.seq AND b.seq >= (1::BIGINT << 35)) OR b.gid >= (1::BIGINT << 26) OR coalesce(p.pair_id, 0) >= (1::BIGINT << 26)
         THEN error('match: a sequence number, group or pair count beyond the instance key''s range')
         WHEN b.is_p2p THEN (1::BIGINT << 62) | (p.pair_id << 36) | b.k
         ELSE (b.gid << 36) | b.k END AS instance_id
FROM _match_base(rid) b
LEFT JOIN _match_pairs p ON b.is_p2p AND p.gid = b.gid
     AND p.src_rank IS NOT DISTINCT FROM b.src_rank AND p.dst_rank IS NOT DISTINCT FROM b.dst_rank;

-- Algorithm: one GROUP BY instance_id. An instance is complete when it has as many calls as
-- expected members, the hashes of their ranks xor to the expected members' (so no rank is missing
-- or doubled, up to a 64-bit hash collision), and one signature (op, compared size, dtype) covers
-- them all. Only the others are examined call by call. The group, the pair and is_p2p come from
-- the instance key, not from aggregates over its 43 million calls at 10,240 ranks; the expected
-- ranks stay in _match_groups (a list per instance would copy the group's ranks millions of times).
-- The same GROUP BY gathers the instance's timing on own clocks (instance_times.sql), kept for the
-- instances whose members share a clock: collperf need not group their members a second time.
CREATE OR REPLACE TEMP TABLE _match_inst AS
WITH agg AS (
    SELECT instance_id, any_value(seq) AS seq,
        count(*) AS num_members, min(step) AS step, max(step) AS max_step, count(step) < count(*) AS any_null_step,
        any_value(op) AS op, min(sig) <> max(sig) AS differ, bit_xor(hash(rank)) AS ranks_xor,
        any_value(dtype) AS dtype, max(in_bytes) AS in_bytes, max(out_bytes) AS out_bytes,
        avg(in_bytes) AS mean_in_bytes, bool_and(on_device) AS on_device,
        count(arrival_ts_ns) AS n_arrivals, min(arrival_ts_ns) AS first_ts_ns, max(arrival_ts_ns) AS last_ts_ns,
        max(it_arrival_key(arrival_ts_ns, rank)) AS last_key, sum(arrival_ts_ns) AS sum_arrival,
        count(end_ts_ns) AS n_ends, sum(end_ts_ns) AS sum_end, min(end_ts_ns) AS min_end, max(end_ts_ns) AS max_end
    FROM (SELECT *, hash(CASE WHEN is_p2p THEN 'p2p' ELSE op END, cmp_elems, dtype) AS sig FROM _match_calls($run_id))
    GROUP BY instance_id
), keyed AS (
    -- the inverse of _match_calls' instance_id
    SELECT a.*, coalesce(p.gid, a.instance_id >> 36) AS gid, a.instance_id >= (1::BIGINT << 62) AS is_p2p,
        p.src_rank, p.dst_rank, p.one_clock AS pair_one_clock
    FROM agg a
    LEFT JOIN _match_pairs p ON a.instance_id >= (1::BIGINT << 62)
         AND p.pair_id = (a.instance_id >> 36) & ((1::BIGINT << 26) - 1)
), expected AS (
    SELECT k.*,
        CASE WHEN k.is_p2p THEN CASE WHEN k.src_rank IS NOT NULL AND k.dst_rank IS NOT NULL
                                     THEN CASE WHEN k.src_rank = k.dst_rank THEN 1 ELSE 2 END END
             ELSE len(g.expected) END AS num_expected,
        CASE WHEN k.is_p2p THEN xor(hash(k.src_rank), hash(k.dst_rank)) ELSE g.expected_xor END AS expected_xor,
        CASE WHEN k.is_p2p THEN coalesce(k.pair_one_clock, false) ELSE g.one_clock END AS one_clock
    FROM keyed k JOIN _match_groups g USING (gid)
)
SELECT * EXCLUDE (expected_xor, pair_one_clock, last_key, sum_arrival, n_ends, sum_end, min_end, max_end),
    coalesce(NOT differ AND num_members = num_expected AND ranks_xor = expected_xor, false) AS complete,
    it_last_rank(last_key, last_ts_ns) AS last_rank, it_wait_ns(num_members, last_ts_ns, sum_arrival) AS wait_ns,
    CASE WHEN n_ends = num_members THEN it_common_end(n_ends, sum_end, min_end, max_end) END AS end_ts_ns
FROM expected;

-- The instances that are not complete, call by call: who is there, what they disagree on, and
-- who was expected.
CREATE OR REPLACE TEMP TABLE _match_odd AS
WITH calls AS (
    SELECT instance_id, list(rank ORDER BY rank) AS present, count(DISTINCT rank) AS num_ranks,
        list(DISTINCT op ORDER BY op) AS ops,
        list(DISTINCT cmp_elems ORDER BY cmp_elems) FILTER (WHERE cmp_elems IS NOT NULL) AS sizes,
        count(DISTINCT CASE lower(regexp_replace(dtype, '^c10::', ''))
            WHEN 'float32' THEN 'float' WHEN 'f32' THEN 'float' WHEN 'float16' THEN 'half' WHEN 'f16' THEN 'half'
            WHEN 'bf16' THEN 'bfloat16' WHEN 'float64' THEN 'double' WHEN 'f64' THEN 'double'
            WHEN 'int64' THEN 'long' WHEN 'i64' THEN 'long' WHEN 'int32' THEN 'int' WHEN 'i32' THEN 'int'
            WHEN 'uint8' THEN 'byte' WHEN 'u8' THEN 'byte' WHEN 'int8' THEN 'char' WHEN 'i8' THEN 'char'
            ELSE lower(regexp_replace(dtype, '^c10::', '')) END) AS num_dtypes,
        list(DISTINCT dtype ORDER BY dtype) FILTER (WHERE dtype IS NOT NULL) AS dtypes
    FROM _match_calls($run_id)
    WHERE instance_id IN (SELECT instance_id FROM _match_inst WHERE NOT complete)
    GROUP BY instance_id
)
SELECT c.*,
    CASE WHEN i.is_p2p THEN CASE WHEN i.src_rank IS NOT NULL AND i.dst_rank IS NOT NULL
                                 THEN list_distinct([i.src_rank, i.dst_rank]) END
         ELSE g.expected END AS expected
FROM calls c JOIN _match_inst i USING (instance_id) JOIN _match_groups g USING (gid);

-- Algorithm: a missing member is excused (the instance is cut, not mismatched) when its rank has
-- no trace, or its traced steps do not cover the instance's steps (ranks whose windows cover
-- different steps are intersected), or, for a rank without ProfilerStep ranges, when the seq lies
-- outside the seqs it traced on that group (pair): then the call fell outside its window.
CREATE OR REPLACE TEMP TABLE _match_missing AS
WITH windows AS (
    SELECT r.rank, min(s.step) AS first_step, max(s.step) AS last_step
    FROM ranks r LEFT JOIN steps s ON s.run_id = r.run_id AND s.rank = r.rank
    WHERE r.run_id = $run_id GROUP BY r.rank
), m AS (
    SELECT i.instance_id, i.gid, i.src_rank, i.dst_rank, i.seq, i.step, i.max_step, i.any_null_step,
        unnest(list_filter(o.expected, lambda r: NOT list_contains(o.present, r))) AS rank
    FROM _match_inst i JOIN _match_odd o USING (instance_id)
), seqs AS (
    -- only ranks without steps need their traced seq range
    SELECT rank, gid, src_rank, dst_rank, min(seq) AS min_seq, max(seq) AS max_seq
    FROM _match_calls($run_id)
    WHERE rank IN (SELECT rank FROM windows WHERE first_step IS NULL) GROUP BY ALL
)
SELECT m.instance_id, m.rank,
    CASE WHEN w.rank IS NULL THEN 'no trace'
         WHEN w.first_step IS NOT NULL AND (m.any_null_step OR m.step < w.first_step OR m.max_step > w.last_step)
             THEN 'outside its traced steps'
         WHEN w.first_step IS NULL AND (m.seq IS NULL OR q.rank IS NULL OR m.seq < q.min_seq OR m.seq > q.max_seq)
             THEN 'outside its traced calls'
    END AS excuse
FROM m
LEFT JOIN windows w ON w.rank = m.rank
LEFT JOIN seqs q ON q.rank = m.rank AND q.gid = m.gid
     AND q.src_rank IS NOT DISTINCT FROM m.src_rank AND q.dst_rank IS NOT DISTINCT FROM m.dst_rank;

INSERT INTO match_instances
WITH missing AS (
    SELECT instance_id,
        list(rank ORDER BY rank) FILTER (WHERE excuse IS NULL) AS missing_in_window,
        list(rank ORDER BY rank) FILTER (WHERE excuse IS NOT NULL) AS cut,
        string_agg(format('rank {} {}', rank, excuse), ', ' ORDER BY rank)
            FILTER (WHERE excuse IS NOT NULL AND excuse <> 'no trace') AS excused,
        list(rank ORDER BY rank) FILTER (WHERE excuse = 'no trace') AS no_trace
    FROM _match_missing GROUP BY instance_id
), judged AS (
    SELECT i.*, o.instance_id IS NOT NULL AS odd, o.present, o.num_ranks, o.ops, o.sizes, o.num_dtypes, o.dtypes,
        coalesce(m.missing_in_window, []) AS missing_in_window, coalesce(m.cut, []) AS cut, m.excused, m.no_trace,
        coalesce(list_filter(o.present, lambda r: NOT list_contains(o.expected, r)), []) AS extra,
        i.is_p2p AND (i.src_rank IS NULL OR i.dst_rank IS NULL) AS peer_unknown
    FROM _match_inst i LEFT JOIN _match_odd o USING (instance_id) LEFT JOIN missing m USING (instance_id)
), problems AS (
    SELECT *,
        concat_ws('; ',
            CASE WHEN peer_unknown THEN 'peer of the send/recv unknown' END,
            CASE WHEN len(missing_in_window) > 0
                 THEN format('ranks {} missing within the steps every member traced', missing_in_window) END,
            CASE WHEN num_members > num_ranks THEN 'a rank called twice' END,
            CASE WHEN len(extra) > 0 THEN format('ranks {} are not in the group', extra) END,
            CASE WHEN len(ops) > 1 AND NOT is_p2p THEN format('different ops {}', ops) END,
            CASE WHEN len(sizes) > 1 THEN format('different sizes {} elements', sizes) END,
            CASE WHEN num_dtypes > 1 THEN format('different dtypes {}', dtypes) END,
            CASE WHEN excused IS NOT NULL THEN format('cut by the trace window: {}', excused) END,
            -- a rank of the job with no trace ingested is missing, not outside a window
            CASE WHEN len(no_trace) > 0 THEN format('the traces of ranks {} are missing (no trace ingested)', no_trace) END) AS why,
        odd AND (len(missing_in_window) > 0 OR num_members > num_ranks OR len(extra) > 0
                 OR (len(ops) > 1 AND NOT is_p2p) OR len(sizes) > 1 OR num_dtypes > 1) AS mismatched
    FROM judged
)
SELECT $run_id, p.instance_id,
    CASE WHEN p.is_p2p THEN 'p2p' WHEN p.odd THEN p.ops[1] ELSE p.op END,
    g.pg_name, g.pg_desc, g.pg_ranks, g.group_size, p.seq, p.src_rank, p.dst_rank, p.step, p.is_p2p,
    p.num_members, p.num_expected, p.missing_in_window, p.cut,
    CASE WHEN NOT p.odd THEN 'complete' WHEN p.peer_unknown THEN 'unknown' WHEN p.mismatched THEN 'mismatch'
         WHEN len(p.cut) > 0 THEN 'cut' ELSE 'complete' END,
    nullif(p.why, ''), p.dtype,
    CAST(CASE WHEN p.is_p2p THEN p.in_bytes
         ELSE CASE p.op
             WHEN 'all_gather' THEN coalesce(p.out_bytes, p.in_bytes * p.num_expected)
             WHEN 'gather' THEN coalesce(p.out_bytes, p.in_bytes * p.num_expected)
             WHEN 'reduce_scatter' THEN coalesce(p.in_bytes, p.out_bytes * p.num_expected)
             WHEN 'scatter' THEN coalesce(p.in_bytes, p.out_bytes * p.num_expected)
             WHEN 'all_to_all' THEN round(p.mean_in_bytes)
             WHEN 'barrier' THEN 0
             ELSE coalesce(p.in_bytes, p.out_bytes) END END AS BIGINT),
    CASE WHEN p.on_device THEN 'device' ELSE 'cpu' END,
    CASE WHEN p.own_clock THEN p.first_ts_ns END, CASE WHEN p.own_clock THEN p.last_ts_ns END,
    CASE WHEN p.own_clock THEN p.last_rank END, CASE WHEN p.own_clock THEN p.wait_ns END,
    CASE WHEN p.own_clock THEN p.end_ts_ns END,
    CASE WHEN g.inferred_ranks IS NOT NULL THEN 'sequence' WHEN g.pg_name IS NOT NULL THEN 'pg_name' ELSE 'pg_ranks' END
FROM (SELECT *, one_clock AND len(extra) = 0 AND n_arrivals = num_members AS own_clock FROM problems) p
JOIN _match_groups g USING (gid);

INSERT INTO match_members
SELECT $run_id, instance_id, rank, call_index, step, arrival_ts_ns, end_ts_ns
FROM _match_calls($run_id);

RESET VARIABLE match_p2p_seq_numbers;
