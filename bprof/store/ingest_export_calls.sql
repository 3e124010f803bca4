-- Which process group, sequence number and peer does each collective call of a re-ingested
-- `bprof export --perfetto` file have? Exactly what the exported run's store said: the export
-- carries each call's identity in its CPU event (chrome_export.CALL_KEY), which the unpack put in
-- _export_calls(rank, tid, cpu_ts_ns, op, ...). It replaces what the trace itself gave, so the
-- calls match as in the original run without its Flight Recorder files or p2p log.
-- A call is keyed by its rank, thread, CPU start and op (outermost calls never overlap on a thread).
UPDATE collectives c
SET pg_name = x.pg_name, pg_desc = x.pg_desc, pg_ranks = x.pg_ranks, group_size = x.group_size,
    seq = x.seq, peer_rank = x.peer_rank, dtype = x.dtype, in_elems = x.in_elems, out_elems = x.out_elems,
    in_bytes = x.in_bytes, out_bytes = x.out_bytes
FROM _export_calls x
WHERE c.run_id = $run_id AND c.rank = x.rank AND c.tid = x.tid AND c.cpu_ts_ns = x.cpu_ts_ns AND c.op = x.op;
