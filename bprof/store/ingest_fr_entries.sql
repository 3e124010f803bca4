-- Which collectives did the Flight Recorder (and bprof's p2p log) see in the window? Reads the
-- per-rank files meta/iteration_<N>/rank<R>.fr.json listed in _fr_files(path, rank); writes the
-- temp table _flight_recorder, one row per entry. Element counts sum the products of the
-- entry's input (output) tensor shapes.
CREATE OR REPLACE TEMP TABLE _flight_recorder AS
WITH entries AS (
    SELECT f.rank, unnest(j.entries) AS e
    FROM read_json($paths, filename = true, columns = {entries: 'JSON[]'}) j
    JOIN _fr_files f ON f.path = j.filename
)
SELECT rank,
       e ->> '$.process_group[0]' AS pg_name,
       e ->> '$.process_group[1]' AS pg_desc,
       CASE WHEN (e ->> '$.is_p2p')::BOOLEAN THEN (e ->> '$.p2p_seq_id')::BIGINT
            ELSE (e ->> '$.collective_seq_id')::BIGINT END AS seq,
       e ->> '$.profiling_name' AS profiling_name,
       (e ->> '$.time_created_ns')::BIGINT AS time_created_ns,
       (e ->> '$.time_done_ns')::BIGINT AS time_done_ns,
       coalesce((e ->> '$.is_p2p')::BOOLEAN, false) AS is_p2p,
       (e ->> '$.peer_rank')::INTEGER AS peer_rank,
       e ->> '$.input_dtypes[0]' AS dtype,
       list_sum(list_transform(TRY_CAST(e -> '$.input_sizes' AS BIGINT[][]),
                               lambda d: coalesce(list_aggregate(d, 'product'), 1))) AS in_elems,
       list_sum(list_transform(TRY_CAST(e -> '$.output_sizes' AS BIGINT[][]),
                               lambda d: coalesce(list_aggregate(d, 'product'), 1))) AS out_elems
FROM entries;
