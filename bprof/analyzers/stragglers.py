"""Which rank or host holds everyone else up, what it costs, and why?

Evidence per rank comes from stragglers.sql (arrivals last, wait imposed, compute score, host and
link evidence). The cost is counterfactual: each candidate's work between collectives is replaced
by the median of its peers' at the same instances, the step is replayed from the matched
collectives (bprof.analyzers.counterfactual), and `lost_ns` is how much shorter the job's step
gets (median over steps). A rank is flagged only when lost_ns >= max(2% of the median step,
3 x the median absolute deviation of the step time).
Reads match_*, collperf_instances, breakdown_steps, timeline_spans, ranks; writes stragglers_ranks.
"""

from __future__ import annotations

import statistics

import duckdb
import numpy as np

from bprof.analyzers.base import Finding, Options, Result, run_sql, severity_for
from bprof.analyzers.counterfactual import StepGraph, replay, work_segments

NAME = "stragglers"
TABLES = ["stragglers_ranks"]
MAX_CANDIDATES = 8


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "stragglers.sql", run_id)
    result = Result(NAME, TABLES)
    graphs, p2p = _step_graphs(con, run_id)
    if not graphs:
        return result
    job_steps = [replay(g).step_ns for g in graphs.values()]
    median_step = statistics.median(job_steps)
    mad = statistics.median(abs(s - median_step) for s in job_steps)
    threshold = max(0.02 * median_step, 3 * mad)

    stats = {r[0]: r for r in con.execute(
        """SELECT rank, host, imposed_wait_ns, last_frac, compute_ns, host_busy_ns, transfer_ratio, score
           FROM stragglers_ranks WHERE run_id = ?""", [run_id]).fetchall()}
    candidates = [r for r, *_ in sorted(stats.values(), key=lambda s: -s[2]) if stats[r][2] > 0][:MAX_CANDIDATES]
    lost = {r: _lost(graphs, p2p, {r}) for r in candidates}
    medians = _medians(stats)
    for rank, ns in lost.items():
        flagged = ns >= threshold
        cause = _cause(stats[rank], medians) if flagged else None
        con.execute("UPDATE stragglers_ranks SET lost_ns = ?, flagged = ?, cause = ? WHERE run_id = ? AND rank = ?",
                    [ns, flagged, cause, run_id, rank])
        if flagged:
            result.findings.append(_rank_finding(rank, stats[rank], ns, cause, median_step, threshold, sorted(graphs)))
    result.findings += _host_findings(graphs, p2p, stats, lost, threshold, median_step)
    return result


def _step_graphs(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[dict[int, StepGraph], set]:
    """Per step, the replay graph of its complete instances; and the ids of the p2p instances."""
    members = con.execute("""
        SELECT step, instance_id, rank, arrival_aligned_ns, end_aligned_ns, is_p2p FROM _st_members ORDER BY step""").fetchnumpy()
    spans = con.execute("""
        SELECT s.step, s.rank, s.ts_ns + coalesce(r.clock_offset_ns, 0), s.ts_ns + s.dur_ns + coalesce(r.clock_offset_ns, 0)
        FROM timeline_spans s JOIN ranks r ON r.run_id = s.run_id AND r.rank = s.rank
        WHERE s.run_id = ? AND s.step >= 0 ORDER BY s.step, s.rank""", [run_id]).fetchall()
    by_step: dict[int, list] = {}
    for step, rank, start, end in spans:
        by_step.setdefault(step, []).append((rank, start, end))
    graphs = {}
    p2p_instances: set = set()
    steps = np.asarray(members["step"])
    for step, rows in by_step.items():
        sel = steps == step
        if not sel.any():
            continue
        ranks_in = set(np.asarray(members["rank"])[sel].tolist())
        rows = [r for r in rows if r[0] in ranks_in] or rows
        p2p_instances.update(np.asarray(members["instance_id"])[sel & np.asarray(members["is_p2p"])].tolist())
        graphs[step] = StepGraph.build(np.asarray(members["instance_id"])[sel], np.asarray(members["rank"])[sel],
                                       np.asarray(members["arrival_aligned_ns"])[sel], np.asarray(members["end_aligned_ns"])[sel],
                                       [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    return graphs, p2p_instances


def _lost(graphs: dict[int, StepGraph], p2p: set, ranks: set[int]) -> int:
    """Median over steps of how much shorter the job's step is when `ranks` work like their peers.
    Only collectives compare peers: the two ends of a send/recv sit on different pipeline stages and
    do different work, so p2p work stays as measured."""
    gains = []
    for g in graphs.values():
        work, _ = work_segments(g)
        like_peers = work.copy()
        ids = g.instance_ids
        for k, rows in enumerate(g.rows_by_instance):
            if ids[k] in p2p:
                continue
            rows = rows.tolist()
            peers = [work[i] for i in rows if int(g.rank[i]) not in ranks]
            if peers:
                median = int(statistics.median(peers))
                for i in rows:
                    if int(g.rank[i]) in ranks:
                        like_peers[i] = median
        gains.append(replay(g).step_ns - replay(g, like_peers).step_ns)
    # a rank whose peers work more than it does gains nothing from working like them
    return max(0, int(statistics.median(gains)))


def _medians(stats: dict) -> dict[str, float]:
    def med(i):
        values = [s[i] for s in stats.values() if s[i] is not None]
        return statistics.median(values) if values else None
    return {"compute": med(4), "host": med(5)}


def _cause(s, medians: dict) -> str:
    """device when its compute exceeds the median rank's by more than its host-side time does, else host.
    (Slow links impose no waits - every member of an instance waits for the same transfer - so
    they are found per host from transfer times, not among stragglers.)"""
    _, _, _, _, compute, host_ns, _, _ = s
    device_excess = (compute or 0) - (medians["compute"] or 0)
    host_excess = (host_ns or 0) - (medians["host"] or 0)
    return "device" if device_excess >= host_excess else "host"


_ADVICE = {
    "device": "Check this rank's device (clocks, thermals, ECC/XID errors, a degraded GPU) or an uneven share of work; "
              "cordon it if the same kernels run slower than on its peers.",
    "host": "Check this rank's host side: CPU contention, GC pauses, data loading, launch gaps (see the idle findings for it).",
}


def _rank_finding(rank: int, s, lost_ns: int, cause: str, median_step: float, threshold: float, steps: list[int]) -> Finding:
    _, host, imposed, last_frac, compute, _, _, score = s
    return Finding(
        severity_for(lost_ns, median_step),
        f"Straggler: rank {rank} ({cause}) holds up its peers; the step would be {lost_ns / 1e6:.2f} ms shorter without it",
        _ADVICE[cause],
        f"Counterfactual: rank {rank} works between collectives like the median of its peers at each instance, and the "
        f"step is replayed from the matched collectives: the job's step gets {lost_ns / 1e6:.2f} ms shorter (median over "
        f"steps; flag threshold {threshold / 1e6:.2f} ms). It arrived last at {100 * (last_frac or 0):.0f}% of its "
        f"collectives and made its peers wait {imposed / 1e6:.2f} ms per step; compute score {score or 0:.2f} "
        f"(median rank's compute over its own).",
        lost_ns, {"ranks": [rank], "steps": steps, "host": host, "cause": cause})


def _host_findings(graphs, p2p: set, stats, lost: dict, threshold: float, median_step: float) -> list[Finding]:
    """A slow host rather than one slow worker: all its ranks together cost clearly more than its worst one."""
    hosts: dict[str, set[int]] = {}
    for rank, s in stats.items():
        if s[1] is not None:
            hosts.setdefault(s[1], set()).add(rank)
    if len(hosts) < 2:
        return []
    out = []
    suspects = {stats[r][1] for r, ns in lost.items() if ns >= threshold and stats[r][1] is not None}
    for host in sorted(suspects):
        ranks = hosts[host]
        host_lost = _lost(graphs, p2p, ranks)
        best_single = max(lost.get(r, 0) for r in ranks)
        if host_lost >= threshold and host_lost > 1.5 * best_single:
            out.append(Finding(
                severity_for(host_lost, median_step),
                f"Slow host: {host} ({len(ranks)} ranks) costs {host_lost / 1e6:.2f} ms per step, more than any one of its ranks",
                "Check the host as a whole: CPU or memory contention, its NIC, its power or thermal state.",
                f"Counterfactual: every rank of {host} works like the median of its peers; the step gets "
                f"{host_lost / 1e6:.2f} ms shorter, against {best_single / 1e6:.2f} ms for its worst single rank.",
                host_lost, {"ranks": sorted(ranks), "steps": sorted(graphs), "host": host}))
    return out
