"""How much memory does each rank hold per step, which operators allocate most, and is a rank out
of line with its peers? From the allocator's [memory] events (definitions in memory.sql).

Reads timeline_spans, events, breakdown_groups (pipeline stages); writes memory_steps, memory_top_ops.
"""

from __future__ import annotations

import statistics

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql, table_exists

NAME = "memory"
TABLES = ["memory_steps", "memory_top_ops"]
# A rank is out of line when its lowest step peak exceeds the median of its peers' by this share and by
# at least MIN_EXCESS_BYTES (a few allocator blocks are not a difference worth a finding).
OUT_OF_LINE_FRAC = 0.10
WARNING_FRAC = 0.25
MIN_EXCESS_BYTES = 1 << 20


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    result = Result(NAME, TABLES)
    run_sql(con, "memory.sql", run_id, {"top_n": options.top_n})
    if not con.execute("SELECT count(*) FROM memory_steps WHERE run_id = ?", [run_id]).fetchone()[0]:
        result.findings.append(not_measurable(
            "Memory: not captured",
            "The analysed steps have no [memory] events: the profiler ran without memory profiling, so peak memory "
            "per step, the allocating operators and ranks out of line cannot be measured.",
            "Record with `bprof record --memory ...` (torch.profiler.profile(profile_memory=True)); it adds "
            "an event per allocation, so keep the step window short."))
        return result
    result.findings.extend(_out_of_line(con, run_id))
    return result


def _stages(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, int]:
    """rank -> pipeline stage (its position in its pipeline group), when the run has pipeline groups."""
    if not table_exists(con, "breakdown_groups"):
        return {}
    stages = {}
    for (ranks,) in con.execute("SELECT pg_ranks FROM breakdown_groups WHERE run_id = ? AND dim = 'pp' AND pg_ranks IS NOT NULL",
                                [run_id]).fetchall():
        for i, r in enumerate(sorted(ranks)):
            stages[r] = i
    return stages


def _out_of_line(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    """Ranks whose lowest step peak of allocated memory (the device's, else the CPU's) exceeds the
    median of their peers' lowest by more than OUT_OF_LINE_FRAC: out of line in every step. A
    median over few steps is not enough: how long gradient buckets stay alive depends on when
    their all-reduce finishes, so one contended step peaks higher (seen: 17.7 MB against 14.0 MB
    between data-parallel replicas, in one step of two). Peers are the other ranks of the same
    pipeline stage (stages hold different layers and activations), else all other ranks. Only
    absolute levels are compared (relative ones start from unknown levels). No time is lost by
    holding memory, so lost_ns is NULL: the cost is headroom (batch size, OOM risk)."""
    rows = con.execute("""
        WITH per_step AS (
            SELECT rank, step, CASE WHEN device LIKE 'cuda:%' THEN 'cuda' ELSE device END AS kind,
                max(peak_allocated_bytes) AS peak
            FROM memory_steps WHERE run_id = ? AND baseline = 'absolute' GROUP BY ALL
        ), main_kind AS (
            SELECT CASE WHEN bool_or(kind = 'cuda') THEN 'cuda' ELSE 'cpu' END AS kind FROM per_step
        )
        SELECT rank, min(peak), list(step ORDER BY step) FROM per_step JOIN main_kind USING (kind)
        GROUP BY rank ORDER BY rank""", [run_id]).fetchall()
    peaks = {r: p for r, p, _ in rows}
    steps = {r: s for r, _, s in rows}
    stages = _stages(con, run_id)
    findings = []
    for rank, peak in peaks.items():
        peers = [p for r, p in peaks.items() if r != rank and stages.get(r) == stages.get(rank)]
        if not peers:
            continue
        typical = statistics.median(peers)
        excess = peak - typical
        if typical <= 0 or excess < MIN_EXCESS_BYTES or excess / typical <= OUT_OF_LINE_FRAC:
            continue
        peer_ranks = [r for r in peaks if r != rank and stages.get(r) == stages.get(rank)]
        top = con.execute("""SELECT name, alloc_bytes FROM memory_top_ops WHERE run_id = ? AND rank = ?
                             ORDER BY alloc_bytes DESC, name LIMIT 3""", [run_id, rank]).fetchall()
        findings.append(Finding(
            "warning" if excess / typical > WARNING_FRAC else "info",
            f"Rank {rank} holds {peak / 2**20:.1f} MiB at peak, {excess / typical:.0%} more than its peers "
            f"({typical / 2**20:.1f} MiB)",
            "Look for uneven work on this rank: an uneven shard (vocabulary, experts, layers per stage), more "
            "micro-batches of activations kept alive, or state that grows across steps (a leak).",
            f"Lowest over steps of the peak allocated bytes (out of line in every step); peers: ranks {peer_ranks}"
            + (" (same pipeline stage)" if rank in stages else "")
            + ". Holding memory costs no step time here; it costs headroom (batch size, out-of-memory risk). "
            + "Largest allocators on this rank: " + ", ".join(f"{n} ({b / 2**20:.1f} MiB)" for n, b in top) + ".",
            None,
            {"ranks": [rank], "steps": steps[rank], "peak_allocated_bytes": int(peak),
             "peer_ranks": peer_ranks, "peer_median_bytes": int(typical)}))
    return findings
