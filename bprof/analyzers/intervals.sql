-- Generic interval helpers: they know intervals, keys and class numbers, nothing about bprof.
-- Input of each macro: the name of a table or view with columns
--   key (any type: the partition, e.g. a {rank, step} struct), cls (INTEGER 0..7),
--   ts_ns (BIGINT start), end_ns (BIGINT end, exclusive).
-- Intervals of one class may overlap each other: a class is "active" while at least one of its
-- intervals covers the instant, so overlaps are counted once (a union per class).

-- iv_segments(tbl): the elementary segments of each key, with the bit mask of the classes active
-- in each (bit c set when class c is active). Segments with no class active are not returned.
-- Algorithm: a sweep line. Every start is +1 and every end -1 for its class; events at the same
-- instant are merged; running sums per class in time order give the active count of each class on
-- [t, next t). One sort per key; no self-join.
CREATE OR REPLACE TEMP MACRO iv_segments(tbl) AS TABLE
WITH pts AS (
    SELECT key, ts_ns AS t, cls, 1 AS d FROM query_table(tbl) WHERE end_ns > ts_ns
    UNION ALL
    SELECT key, end_ns AS t, cls, -1 AS d FROM query_table(tbl) WHERE end_ns > ts_ns
), merged AS (
    SELECT key, t,
        coalesce(sum(d) FILTER (WHERE cls = 0), 0) AS d0, coalesce(sum(d) FILTER (WHERE cls = 1), 0) AS d1,
        coalesce(sum(d) FILTER (WHERE cls = 2), 0) AS d2, coalesce(sum(d) FILTER (WHERE cls = 3), 0) AS d3,
        coalesce(sum(d) FILTER (WHERE cls = 4), 0) AS d4, coalesce(sum(d) FILTER (WHERE cls = 5), 0) AS d5,
        coalesce(sum(d) FILTER (WHERE cls = 6), 0) AS d6, coalesce(sum(d) FILTER (WHERE cls = 7), 0) AS d7
    FROM pts GROUP BY key, t
), running AS (
    SELECT key, t AS ts_ns, lead(t) OVER w AS end_ns,
        sum(d0) OVER w AS c0, sum(d1) OVER w AS c1, sum(d2) OVER w AS c2, sum(d3) OVER w AS c3,
        sum(d4) OVER w AS c4, sum(d5) OVER w AS c5, sum(d6) OVER w AS c6, sum(d7) OVER w AS c7
    FROM merged
    WINDOW w AS (PARTITION BY key ORDER BY t ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW)
)
SELECT key, ts_ns, end_ns,
    CAST((c0 > 0)::INTEGER + 2 * (c1 > 0)::INTEGER + 4 * (c2 > 0)::INTEGER + 8 * (c3 > 0)::INTEGER
       + 16 * (c4 > 0)::INTEGER + 32 * (c5 > 0)::INTEGER + 64 * (c6 > 0)::INTEGER
       + 128 * (c7 > 0)::INTEGER AS INTEGER) AS mask
FROM running
WHERE end_ns IS NOT NULL AND (c0 > 0 OR c1 > 0 OR c2 > 0 OR c3 > 0 OR c4 > 0 OR c5 > 0 OR c6 > 0 OR c7 > 0);

-- iv_coverage(tbl): total time per key and class mask (the segments, summed).
CREATE OR REPLACE TEMP MACRO iv_coverage(tbl) AS TABLE
SELECT key, mask, CAST(sum(end_ns - ts_ns) AS BIGINT) AS dur_ns
FROM iv_segments(tbl)
GROUP BY key, mask;

-- iv_union(tbl): the union of each key's intervals, classes ignored, as maximal intervals.
-- Algorithm: gaps and islands; an interval starts a new island when it begins after the running
-- maximum end of the intervals before it.
CREATE OR REPLACE TEMP MACRO iv_union(tbl) AS TABLE
WITH ordered AS (
    SELECT key, ts_ns, end_ns,
        max(end_ns) OVER (PARTITION BY key ORDER BY ts_ns, end_ns
                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end_ns
    FROM query_table(tbl) WHERE end_ns > ts_ns
), islands AS (
    SELECT *, sum(CASE WHEN prev_end_ns IS NULL OR ts_ns > prev_end_ns THEN 1 ELSE 0 END)
                  OVER (PARTITION BY key ORDER BY ts_ns, end_ns ROWS UNBOUNDED PRECEDING) AS island
    FROM ordered
)
SELECT key, min(ts_ns) AS ts_ns, max(end_ns) AS end_ns FROM islands GROUP BY key, island;
