-- An instance's timing from the arrivals and ends of its members on one clock, as scalar macros
-- over per-instance aggregates: match applies them to own clocks when an instance's members share
-- one (one host), collperf to aligned clocks when they do not. Macros, not a query, so that each
-- caller folds the aggregates into a GROUP BY it runs anyway.
--
-- Definitions:
-- * last arrival: the latest arrival; its rank the lowest rank on a tie. One max over
--   it_arrival_key(arrival, rank) = arrival x 2^32 + (2^31 - 1 - rank) finds both.
-- * wait: the sum over the members of (last arrival - own arrival) = n x last - sum of arrivals.
-- * common end: the median of the members' ends for up to 4 members; beyond, their mean without the
--   earliest and the latest end (robust like the median, and cheap at 10,000 ranks).
--   The mean is rounded down (toward minus infinity), so that adding a clock offset to every end
--   adds it to the common end exactly: aligned = own + offset holds for instances as for members.
-- Epoch-sized nanosecond counts never go through a double: sums are HUGEINT, and the common end
-- divides in BIGINT: sum = count x earliest end + excess, and only the excess (the ends' spread,
-- not their epoch; never negative) is divided; a HUGEINT division cost seconds at 10,240 ranks and
-- stays the fallback for an excess beyond BIGINT.

CREATE OR REPLACE TEMP MACRO it_arrival_key(arrival_ns, rank) AS
    CAST(arrival_ns AS HUGEINT) * 4294967296 + (2147483647 - rank);

-- the rank packed into max(it_arrival_key(...)), given the last arrival
CREATE OR REPLACE TEMP MACRO it_last_rank(last_key, last_ns) AS
    2147483647 - CAST(last_key - CAST(last_ns AS HUGEINT) * 4294967296 AS BIGINT);

CREATE OR REPLACE TEMP MACRO it_wait_ns(n, last_ns, sum_arrival) AS
    CAST(n * CAST(last_ns AS HUGEINT) - sum_arrival AS BIGINT);

-- the ends the common end averages: all of up to 2, else all but the earliest and the latest
CREATE OR REPLACE TEMP MACRO it_end_sum(n_ends, sum_end, min_end, max_end) AS
    CASE WHEN n_ends <= 2 THEN sum_end ELSE sum_end - min_end - max_end END;
CREATE OR REPLACE TEMP MACRO it_end_count(n_ends) AS
    CASE WHEN n_ends <= 2 THEN n_ends ELSE n_ends - 2 END;

CREATE OR REPLACE TEMP MACRO it_end_from(end_sum, end_count, min_end, excess_ns) AS
    CASE WHEN end_count = 0 THEN NULL
         WHEN excess_ns IS NULL THEN CAST((end_sum - (end_sum % end_count + end_count) % end_count) // end_count AS BIGINT)
         ELSE min_end + excess_ns // end_count
    END;

-- the common end from count, sum, min and max of the members' ends (NULL without ends)
CREATE OR REPLACE TEMP MACRO it_common_end(n_ends, sum_end, min_end, max_end) AS
    it_end_from(it_end_sum(n_ends, sum_end, min_end, max_end), it_end_count(n_ends), min_end,
                TRY_CAST(it_end_sum(n_ends, sum_end, min_end, max_end) - it_end_count(n_ends) * CAST(min_end AS HUGEINT) AS BIGINT));
