-- Apply the solved clock offsets (clock.py wrote them to the temp table _clock_solution): the
-- clock_hosts rows, and ranks.clock_offset_ns and clock_residual_ns (the only store columns an
-- analyzer writes), from which the view match_members_aligned gives every member's aligned times
-- (aligned = own + offset).

INSERT INTO clock_hosts
SELECT $run_id, s.host, d.ranks, s.offset_ns, s.residual_ns, s.method, s.via_host,
    coalesce(n.num_samples, 0), coalesce(x.num_collectives, 0)
FROM _clock_solution s
JOIN (SELECT host, list(rank ORDER BY rank) AS ranks FROM _clock_domains GROUP BY host) d USING (host)
LEFT JOIN (SELECT d.host, count(*) AS num_samples FROM clock_samples c JOIN _clock_domains d USING (rank)
           WHERE c.run_id = $run_id GROUP BY d.host) n USING (host)
LEFT JOIN (SELECT host, sum(num_obs) AS num_collectives
           FROM (SELECT anchor AS host, num_obs FROM _clock_exit_edges UNION ALL SELECT host, num_obs FROM _clock_exit_edges)
           GROUP BY host) x USING (host);

UPDATE ranks r SET clock_offset_ns = h.offset_ns, clock_residual_ns = h.residual_ns
FROM (SELECT d.rank, s.offset_ns, s.residual_ns FROM _clock_solution s JOIN _clock_domains d USING (host)) h
WHERE r.run_id = $run_id AND r.rank = h.rank;
