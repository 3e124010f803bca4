"""Which rank or host holds everyone else up, what it costs, and why?

Evidence per rank comes from stragglers.sql (arrivals last, wait imposed, compute score, host and
link evidence). The cost is counterfactual: each candidate's work between collectives is replaced
by the median of the ranks that play the same role in the step (the same sequence of collectives), the step is replayed from the matched
collectives (bprof.analyzers.counterfactual), and `lost_ns` is how much shorter the job's step
gets (median over steps, and 0 unless 75% of the steps gain at least half of that median). A rank is
flagged only when lost_ns >= max(2% of the median step, 3 x the median absolute deviation of the
step time).
Reads match_*, collperf_instances, breakdown_steps, timeline_spans, ranks; writes stragglers_ranks.
"""

from __future__ import annotations

import statistics

import duckdb
import numpy as np

from bprof.analyzers.base import Finding, Options, Result, run_sql, severity_for
from bprof.analyzers.counterfactual import StepGraph, exit_offsets, replay, work_segments

NAME = "stragglers"
TABLES = ["stragglers_ranks"]
MAX_CANDIDATES = 8
MAX_HOST_CANDIDATES = 4
MIN_LINK_RATIO = 1.5  # inter-host transfers this much slower than elsewhere make a host a suspect


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "stragglers.sql", run_id)
    result = Result(NAME, TABLES)
    graphs, roles = _step_graphs(con, run_id)
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
    lost = {r: _lost(graphs, roles, {r}) for r in candidates}
    medians = _medians(stats)
    for rank, ns in lost.items():
        flagged = ns >= threshold
        cause = _cause(stats[rank], medians) if flagged else None
        con.execute("UPDATE stragglers_ranks SET lost_ns = ?, flagged = ?, cause = ? WHERE run_id = ? AND rank = ?",
                    [ns, flagged, cause, run_id, rank])
        if flagged:
            result.findings.append(_rank_finding(rank, stats[rank], ns, cause, median_step, threshold, sorted(graphs)))
    result.findings += _host_findings(graphs, roles, stats, lost, threshold, median_step)
    result.findings += _link_findings(con, run_id, graphs, threshold, median_step)
    return result


def _step_graphs(con: duckdb.DuckDBPyConnection, run_id: int) -> tuple[dict[int, StepGraph], dict[int, list[str]]]:
    """Per step, the replay graph of its complete instances, and the role (op/group size) of each of
    its member rows."""
    members = con.execute("""
        SELECT step, instance_id, rank, arrival_aligned_ns, end_aligned_ns, role FROM _st_members
        ORDER BY step, rank, arrival_aligned_ns, instance_id""").fetchnumpy()
    spans = con.execute("""
        SELECT s.step, s.rank, s.ts_ns + coalesce(r.clock_offset_ns, 0), s.ts_ns + s.dur_ns + coalesce(r.clock_offset_ns, 0)
        FROM timeline_spans s JOIN ranks r ON r.run_id = s.run_id AND r.rank = s.rank
        WHERE s.run_id = ? AND s.step >= 0 ORDER BY s.step, s.rank""", [run_id]).fetchall()
    by_step: dict[int, list] = {}
    for step, rank, start, end in spans:
        by_step.setdefault(step, []).append((rank, start, end))
    role_of = dict(zip(zip(np.asarray(members["instance_id"]).tolist(), np.asarray(members["rank"]).tolist()),
                       np.asarray(members["role"]).tolist()))
    graphs, roles = {}, {}
    steps = np.asarray(members["step"])
    for step, rows in by_step.items():
        sel = steps == step
        if not sel.any():
            continue
        g = StepGraph.build(np.asarray(members["instance_id"])[sel], np.asarray(members["rank"])[sel],
                            np.asarray(members["arrival_aligned_ns"])[sel], np.asarray(members["end_aligned_ns"])[sel],
                            [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
        graphs[step] = g
        roles[step] = [role_of[(g.instance_ids[k], r)] for k, r in zip(g.instance.tolist(), g.rank.tolist())]
    return graphs, roles


def _lost(graphs: dict[int, StepGraph], roles: dict[int, list[str]], ranks: set[int]) -> int:
    """Median over steps of how much shorter the job's step is when `ranks` work like the median rank
    of their role. Ranks share a role when they join the same collectives in a step (the same count
    of each op and group size: the ranks of one pipeline stage, one layer of the parallel layout).
    The work before a rank's j-th collective of a kind takes the median over the role's other ranks
    of the work before their j-th of that kind (chain order can differ between ranks when several
    collectives are in flight), and the tail after the last one the median of their tails; a rank
    whose role nobody else plays keeps its own work."""
    gains = []
    for step, g in graphs.items():
        work, tail = work_segments(g)
        labels = roles[step]
        occurrence: dict[int, dict[tuple[str, int], int]] = {}
        seen: dict[tuple[int, str], int] = {}
        for i, r in enumerate(g.rank.tolist()):
            j = seen.get((r, labels[i]), 0)
            seen[(r, labels[i])] = j + 1
            occurrence.setdefault(r, {})[(labels[i], j)] = i
        signature = {r: frozenset(occ) for r, occ in occurrence.items()}
        tail_of = dict(zip(g.span_rank.tolist(), tail.tolist()))
        span_index = {r: k for k, r in enumerate(g.span_rank.tolist())}
        new_work, new_tail = work.copy(), tail.copy()
        for r in ranks & occurrence.keys():
            peers = [q for q in occurrence if q not in ranks and signature[q] == signature[r]]
            if not peers:
                continue
            for key, i in occurrence[r].items():
                new_work[i] = int(statistics.median(work[occurrence[q][key]] for q in peers))
            new_tail[span_index[r]] = int(statistics.median(tail_of[q] for q in peers))
        gains.append(replay(g).step_ns - replay(g, new_work, new_tail).step_ns)
    return _summarise(gains)


CONSISTENT_FRAC = 0.75  # of the steps must gain at least half the median gain


def _summarise(gains: list[int]) -> int:
    """The median gain over steps - or 0 unless at least 75% of the steps gain half of it: a real
    straggler costs in (nearly) every step, while contention on a shared machine hits one step and
    not the next. One step in four may fall short (a GC pause or a contended core on a peer that
    step shrinks the gain; seen in CI with 4 steps), not more: a rank that is slow in two of four
    steps is noise. A rank whose peers work more than it does gains nothing from working like them
    (never < 0)."""
    median = statistics.median(gains)
    if median <= 0:
        return 0
    consistent = sum(g >= median / 2 for g in gains)
    if consistent < CONSISTENT_FRAC * len(gains):
        return 0
    return int(median)


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


def _host_findings(graphs, roles, stats, lost: dict, threshold: float, median_step: float) -> list[Finding]:
    """A slow host rather than one slow worker: all its ranks together cost clearly more than its
    worst one. Candidates: the hosts whose ranks impose the most wait."""
    hosts: dict[str, set[int]] = {}
    for rank, s in stats.items():
        if s[1] is not None:
            hosts.setdefault(s[1], set()).add(rank)
    if len(hosts) < 2:
        return []
    imposed = {h: sum(stats[r][2] or 0 for r in ranks) for h, ranks in hosts.items()}
    out = []
    for host in sorted(hosts, key=lambda h: -imposed[h])[:MAX_HOST_CANDIDATES]:
        ranks = hosts[host]
        if imposed[host] <= 0:
            continue
        host_lost = _lost(graphs, roles, ranks)
        best_single = max((lost.get(r) or 0) for r in ranks)
        if host_lost >= threshold and host_lost > 1.5 * best_single:
            cause = _host_cause([stats[r] for r in ranks], _medians(stats))
            out.append(Finding(
                severity_for(host_lost, median_step),
                f"Slow host: {host} ({len(ranks)} ranks, {cause}) costs {host_lost / 1e6:.2f} ms per step, more than any one of its ranks",
                _HOST_ADVICE[cause],
                f"Counterfactual: every rank of {host} works like the median rank of its role elsewhere; the step gets "
                f"{host_lost / 1e6:.2f} ms shorter, against {best_single / 1e6:.2f} ms for its worst single rank.",
                host_lost, {"ranks": sorted(ranks), "steps": sorted(graphs), "host": host, "cause": cause}))
    return out


_HOST_ADVICE = {
    "device": "Check the host's devices as a whole: clocks, power capping, thermals, a slower SKU or driver on that node.",
    "host": "Check the host side as a whole: CPU or memory contention, data loading, other jobs on the node.",
}


def _host_cause(rows: list, medians: dict) -> str:
    """device when its ranks' compute exceeds the median rank's by more than their host-side time does."""
    device = sum((r[4] or 0) - (medians["compute"] or 0) for r in rows)
    host = sum((r[5] or 0) - (medians["host"] or 0) for r in rows)
    return "device" if device >= host else "host"


def _link_findings(con, run_id: int, graphs: dict[int, StepGraph], threshold: float, median_step: float) -> list[Finding]:
    """Slow links: inter-host transfers touching a host are slower than the same op and size between
    other hosts. A group spanning two hosts cannot tell which end is slow, so a host's ratio is the
    lowest over the (op, size) classes it takes part in: only a host slow in every class stands out."""
    rows = con.execute("""
        WITH inst AS (
            SELECT c.instance_id, c.op, c.bytes, c.transfer_ns, list(DISTINCT r.host) AS hosts
            FROM collperf_instances c
            JOIN match_members m ON m.run_id = c.run_id AND m.instance_id = c.instance_id
            JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank
            WHERE c.run_id = ? AND c.transfer_ns > 0 AND r.host IS NOT NULL
            GROUP BY c.instance_id, c.op, c.bytes, c.transfer_ns HAVING count(DISTINCT r.host) > 1
        ), classes AS (
            SELECT h.host, i.op, i.bytes,
                median(i.transfer_ns) FILTER (WHERE list_contains(i.hosts, h.host)) AS touching_ns,
                median(i.transfer_ns) FILTER (WHERE NOT list_contains(i.hosts, h.host)) AS other_ns
            FROM (SELECT DISTINCT unnest(hosts) AS host FROM inst) h, inst i GROUP BY ALL
        )
        SELECT host, min(touching_ns / other_ns) AS ratio FROM classes
        WHERE touching_ns IS NOT NULL AND other_ns > 0 GROUP BY host ORDER BY ratio DESC""", [run_id]).fetchall()
    out = []
    for host, ratio in rows[:MAX_HOST_CANDIDATES]:
        if ratio < MIN_LINK_RATIO:
            break
        slowed = {iid for (iid,) in con.execute("""
            SELECT DISTINCT m.instance_id FROM match_members m JOIN ranks r ON r.run_id = m.run_id AND r.rank = m.rank
            WHERE m.run_id = ? AND m.instance_id IN (
                SELECT m2.instance_id FROM match_members m2 JOIN ranks r2 ON r2.run_id = m2.run_id AND r2.rank = m2.rank
                WHERE m2.run_id = ? GROUP BY m2.instance_id HAVING count(DISTINCT r2.host) > 1)
              AND r.host = ?""", [run_id, run_id, host]).fetchall()}
        gains = []
        for g in graphs.values():
            exits = exit_offsets(g)
            faster = exits.copy()
            touched = np.array([g.instance_ids[k] in slowed for k in g.instance.tolist()], dtype=bool)
            faster[touched] = (exits[touched] / ratio).astype(np.int64)
            gains.append(replay(g).step_ns - replay(g, exit_after_ns=faster).step_ns)
        link_lost = _summarise(gains)
        if link_lost >= threshold:
            out.append(Finding(
                severity_for(link_lost, median_step),
                f"Slow link: inter-host transfers of {host} take {ratio:.1f}x as long as the same ops between other hosts",
                "Check this host's network path (NIC, cables, switch port, PCIe/NVLink errors, congestion).",
                f"Counterfactual: its inter-host transfers at the speed of the same op and size elsewhere (divided by "
                f"{ratio:.2f}); the step gets {link_lost / 1e6:.2f} ms shorter.",
                link_lost, {"ranks": sorted(r for (r,) in con.execute(
                    "SELECT rank FROM ranks WHERE run_id = ? AND host = ?", [run_id, host]).fetchall()),
                    "steps": sorted(graphs), "host": host, "cause": "link"}))
    return out
