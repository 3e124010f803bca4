"""Which rank or host holds everyone else up, what it costs, and why?

Evidence per rank comes from stragglers.sql (arrivals last, wait imposed, compute score, host and
link evidence). The cost is counterfactual: each candidate's work between collectives is replaced
by the median of the ranks that play the same role in the step (same pipeline stage, same count of
each collective: see bprof.whatif.peers), the step is replayed from the matched collectives
(bprof.analyzers.counterfactual), and `lost_ns` is how much shorter the job's step gets (median
over steps, and 0 unless 75% of the steps gain at least half of that median - or unless the rank
is measurably slower than its peers, which shows the cause recurs: its own time, the step less
exposed communication, beyond 3 x their step-to-step spread in 75% of the steps). A rank is
flagged when lost_ns >= max(2% of the median step, 3 x the median absolute deviation of the step
time); a measurably slower rank under that with a cost gets an info finding at the same price.
Candidates: the MAX_CANDIDATES ranks imposing the most wait, the MAX_HOST_CANDIDATES hosts whose
ranks impose the most, and the hosts whose inter-host transfers are slowest; they are known before
any step is replayed, so steps are built and priced one at a time.
Reads match_instances, match_members_aligned, collperf_instances, breakdown_steps, bubbles_stages,
timeline_spans, ranks; writes stragglers_ranks.
"""

from __future__ import annotations

import math
import statistics
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import duckdb
import numba
import numpy as np
import pyarrow as pa

from bprof.analyzers.base import Finding, Options, Result, run_sql, severity_for, table_exists
from bprof.whatif import graph
from bprof.whatif.engine import StepGraph, _take
from bprof.whatif.peers import SYMMETRIC_OPS, PeerStep

NAME = "stragglers"
TABLES = ["stragglers_ranks"]
MAX_CANDIDATES = 8
MAX_HOST_CANDIDATES = 4
MIN_LINK_RATIO = 1.5  # inter-host transfers this much slower than elsewhere make a host a suspect


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "stragglers.sql", run_id)
    result = Result(NAME, TABLES)
    stats = _rank_stats(con, run_id)
    candidates = [r for r, *_ in sorted(stats.values(), key=lambda s: -s[2]) if stats[r][2] > 0][:MAX_CANDIDATES]
    hosts = _host_candidates(stats)
    links = _link_candidates(con, run_id)
    # What to price is known before any step is replayed, so one step's graph is in memory at a time
    # (20 million member rows per step at 10,240 ranks).
    job_steps, gains = [], {}
    priced = set(candidates).union(*hosts.values())
    steps = _analysed_steps(con, run_id)
    evidence = _MemberEvidence()
    own = _OwnTime(candidates)
    # (no zip or enumerate: their reused tuple would hold this step while the next one is built)
    for step in _steps(con, run_id, steps, priced, evidence):
        own.add(steps[len(job_steps)], step)  # steps come in the order of `steps`
        job_steps.append(step.step_ns)
        keys = [("rank", r) for r in candidates] + [("host", h) for h in hosts]
        for key, gain in zip(keys, step.gains([{r} for r in candidates] + list(hosts.values()))):
            gains.setdefault(key, []).append(gain)
        for host, (ratio, slowed) in links.items():
            gains.setdefault(("link", host), []).append(step.link_gain(slowed, ratio))
        del step  # before the next step is built: two steps' arrays at once would double the peak
    evidence.write(con, run_id)
    if not job_steps:
        return result
    stats = _rank_stats(con, run_id)  # with last_frac, known once the members were read
    own.read(con, run_id)
    median_step = statistics.median(job_steps)
    mad = statistics.median(abs(s - median_step) for s in job_steps)
    threshold = max(0.02 * median_step, 3 * mad)
    slower_by_rank = {rank: own.slower(rank) for rank in candidates}
    lost = {key: _summarise(g, recurs=key[0] == "rank" and bool(slower_by_rank[key[1]].measurable))
            for key, g in gains.items()}
    for rank in candidates:
        ns = lost[("rank", rank)]
        flagged = ns >= threshold
        slower = slower_by_rank[rank]
        small = not flagged and ns > 0 and bool(slower.measurable)
        peers = {p: stats[p] for p in own.peer_ranks(rank)} or stats  # no peers: every rank
        cause = _cause(stats[rank], _medians(peers)) if flagged or small else None
        con.execute("""UPDATE stragglers_ranks SET lost_ns = ?, flagged = ?, cause = ?, extra_own_ns = ?, spread_ns = ?,
                           measurably_slower = ? WHERE run_id = ? AND rank = ?""",
                    [ns, flagged, cause, slower.extra_ns, slower.spread_ns, slower.measurable, run_id, rank])
        if flagged:
            result.findings.append(_rank_finding(rank, stats[rank], ns, cause, median_step, threshold, steps))
        elif small:
            result.findings.append(_small_rank_finding(rank, stats[rank], ns, cause, slower, threshold, steps))
    single = {r: lost[("rank", r)] for r in candidates}
    result.findings += _host_findings(hosts, stats, single, {h: lost[("host", h)] for h in hosts}, threshold, median_step, steps)
    result.findings += _link_findings(con, run_id, {h: (links[h][0], lost[("link", h)]) for h in links}, threshold,
                                      median_step, steps)
    return result


def _rank_stats(con: duckdb.DuckDBPyConnection, run_id: int) -> dict[int, tuple]:
    return {r[0]: r for r in con.execute(
        """SELECT rank, host, imposed_wait_ns, last_frac, compute_ns, host_busy_ns, transfer_ratio, score
           FROM stragglers_ranks WHERE run_id = ?""", [run_id]).fetchall()}


def _analysed_steps(con: duckdb.DuckDBPyConnection, run_id: int) -> list[int]:
    """Steps with complete instances and spans: the steps the counterfactual replays."""
    return [s for (s,) in con.execute("""
        SELECT DISTINCT step FROM _st_instances WHERE step IN (SELECT step FROM timeline_spans WHERE run_id = ? AND step >= 0)
        ORDER BY step""", [run_id]).fetchall()]


class _MemberEvidence:
    """Per rank, what only its member rows tell: how many instances it joined, and the median transfer
    ratio of its instances per step (then the median over steps); gathered while the steps are read."""

    def __init__(self):
        self.count: dict[int, int] = {}
        self.ratios: dict[int, list[float]] = {}

    def add(self, g: StepGraph, ratio: np.ndarray) -> None:
        counts = np.bincount(g.row_span, minlength=len(g.span_rank))
        medians = _median_by_run(g.row_span, ratio, len(g.span_rank))
        for rank, n, med in zip(g.span_rank.tolist(), counts.tolist(), medians.tolist()):
            self.count[rank] = self.count.get(rank, 0) + n
            if med == med:  # not NaN: the rank has instances with a transfer time this step
                self.ratios.setdefault(rank, []).append(med)

    def write(self, con: duckdb.DuckDBPyConnection, run_id: int) -> None:
        ranks = sorted(self.count)
        table = pa.table({
            "rank": pa.array(ranks, pa.int32()),
            "num_instances": pa.array([self.count[r] for r in ranks], pa.int64()),
            "transfer_ratio": pa.array([statistics.median(self.ratios[r]) if r in self.ratios else None for r in ranks],
                                       pa.float64())})
        con.register("_st_evidence", table)
        try:
            con.execute("""
                UPDATE stragglers_ranks s SET num_instances = e.num_instances, transfer_ratio = e.transfer_ratio,
                    last_frac = s.num_last / nullif(e.num_instances, 0)
                FROM _st_evidence e WHERE s.run_id = ? AND s.rank = e.rank""", [run_id])
        finally:
            con.unregister("_st_evidence")


def _steps(con: duckdb.DuckDBPyConnection, run_id: int, steps: list[int], priced: set[int], evidence: _MemberEvidence):
    """Each step's replay graph of its complete instances with each member row's role (op/group
    size), ready to price sets of ranks; one step at a time (members read per step, never all at once).
    The next step's rows are read while this one is built and priced (DuckDB works without the GIL):
    the caller must not use the connection while it iterates."""
    stage = dict(con.execute("SELECT rank, any_value(stage) FROM bubbles_stages WHERE run_id = ? GROUP BY rank",
                             [run_id]).fetchall()) if table_exists(con, "bubbles_stages") else {}
    graph.prepare_host(con, run_id)
    with ThreadPoolExecutor(1) as reader:
        pending = reader.submit(_read_step, con, run_id, steps[0]) if steps else None
        for i in range(len(steps)):
            inst, m, spans = pending.result()
            pending = reader.submit(_read_step, con, run_id, steps[i + 1]) if i + 1 < len(steps) else None
            g = StepGraph.build(m["dense_id"], m["rank"], m["arrival_aligned_ns"], m["end_aligned_ns"],
                                spans["rank"], spans["start_ns"], spans["end_ns"], instance_ids=inst["instance_id"],
                                issue_ns=m["issue_ns"], host_waited=m["host_waited"])
            role = _take(m["role_id"], g.source_row)
            evidence.add(g, inst["ratio"][g.instance])
            del m
            stages = np.array([stage.get(r, -1) for r in g.span_rank.tolist()], dtype=np.int64)
            yield PeerStep(g, role, stages, priced, symmetric=inst["symmetric"].astype(bool))


def _read_step(con: duckdb.DuckDBPyConnection, run_id: int, step: int) -> tuple[dict, dict, dict]:
    """A step's complete instances (in dense order), their member rows, and the ranks' spans."""
    def read(sql: str, params) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in con.execute(sql, params).fetchnumpy().items()}

    # the step's instances numbered 0.. by instance id: a window per step sorts in parallel, one
    # partitioned by step over every step did not (1.4-1.6 s against 0.9 s for two steps)
    con.execute("""CREATE OR REPLACE TEMP TABLE _st_step AS
                   SELECT *, CAST(row_number() OVER (ORDER BY instance_id) - 1 AS INTEGER) AS dense_id
                   FROM _st_instances WHERE step = ?""", [step])
    inst = read("""SELECT instance_id, coalesce(ratio, 'NaN'::DOUBLE) AS ratio, list_contains($symmetric, op) AS symmetric
                   FROM _st_step ORDER BY dense_id""", {"symmetric": list(SYMMETRIC_OPS)})
    members = read("""
        SELECT i.dense_id, m.rank, m.arrival_aligned_ns,
            -- the end, or where the training thread resumed before its range closed (host.sql)
            coalesce(h.end_aligned_ns, m.end_aligned_ns) AS end_aligned_ns,
            -- what the member does: its op and group size; a send and a recv are different roles
            CAST(2 * i.kind + CASE WHEN i.is_p2p AND m.rank = i.src_rank THEN 1 ELSE 0 END AS INTEGER) AS role_id,
            -- the issue and the host's wait, as the what-if graph has them (bprof/whatif/host.sql)
            coalesce(h.issue_aligned_ns, m.arrival_aligned_ns) AS issue_ns, coalesce(h.host_waited, true) AS host_waited
        FROM match_members_aligned m JOIN _st_step i USING (instance_id)
        LEFT JOIN whatif_host_members h ON h.instance_id = m.instance_id AND h.rank = m.rank AND h.call_index = m.call_index
        WHERE m.run_id = ? AND m.arrival_aligned_ns IS NOT NULL""", [run_id])
    spans = read("""
        SELECT s.rank, s.ts_ns + coalesce(r.clock_offset_ns, 0) AS start_ns,
            s.ts_ns + s.dur_ns + coalesce(r.clock_offset_ns, 0) AS end_ns
        FROM timeline_spans s JOIN ranks r ON r.run_id = s.run_id AND r.rank = s.rank
        WHERE s.run_id = $1 AND s.step = $2""", [run_id, step])
    return inst, members, spans


CONSISTENT_FRAC = 0.75  # of the steps must gain at least half the median gain


def _summarise(gains: list[int], recurs: bool = False) -> int:
    """The median gain over steps - or 0 unless at least 75% of the steps gain half of it: a real
    straggler costs in (nearly) every step, while contention on a shared machine hits one step and
    not the next. One step in four may fall short (a GC pause or a contended core on a peer that
    step shrinks the gain; seen in CI with 4 steps), not more: a rank that is slow in two of four
    steps is noise. When the cause is already known to recur (`recurs`: a rank measurably slower
    than its peers in most steps), the median alone: where one rank's delay lands on the critical
    path can change from step to step (seen: 1.6, 1.6 and 0.6 ms for a planted 5 ms of compute
    every step), and it is no sign of noise. A rank whose peers work more than it does gains nothing
    from working like them (never < 0)."""
    median = statistics.median(gains)
    if median <= 0:
        return 0
    if recurs:
        return int(median)
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
    """device when its compute exceeds the median peer's by more than its host-side time does, else host.
    The medians are its peers' (the ranks of its role): against every rank's, a first-stage rank of a
    pipeline is compared with the later stages' heavier compute and its own extra compute disappears.
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


class _OwnTime:
    """Per candidate and analysed step, its peers (the other ranks of its role signature, as the
    pricing compares them), gathered while the steps are priced; then its own time and theirs.

    A rank's own time in a step is its span less its exposed communication (breakdown_steps): its
    compute, host-side and copy time, the waits for late peers and the transfers excluded. Not the
    engine's work between collectives: there a kernel queued on a stream behind a collective that
    waits for a late peer counts as work, so the victims of a straggler look slow as well (seen on
    a synthetic stalled input: two ranks of the next stage 6 ms above their peers)."""

    def __init__(self, ranks: list[int]):
        self.ranks = np.asarray(sorted(ranks), dtype=np.int64)
        self.steps: dict[int, list[tuple[int, list[int]]]] = {r: [] for r in self.ranks.tolist()}  # (step, peers)
        self.times: dict[tuple[int, int], int] = {}  # (rank, step) -> own time

    def add(self, step_no: int, step: PeerStep) -> None:
        span_rank = step.g.span_rank
        at = np.minimum(np.searchsorted(span_rank, self.ranks), max(len(span_rank) - 1, 0))
        for rank, i in zip(self.ranks.tolist(), at.tolist()):
            if len(span_rank) and span_rank[i] == rank:  # else no span this step
                peers = np.flatnonzero(step.sig == step.sig[i])
                self.steps[rank].append((step_no, span_rank[peers[peers != i]].tolist()))

    def read(self, con: duckdb.DuckDBPyConnection, run_id: int) -> None:
        self.times = {(r, s): own for r, s, own in con.execute(
            """SELECT rank, step, span_ns - exposed_comm_ns FROM breakdown_steps
               WHERE run_id = ? AND step >= 0""", [run_id]).fetchall()}

    def slower(self, rank: int) -> Slower:
        own, peers = [], []
        for step, ranks in self.steps[rank]:
            if (rank, step) in self.times:
                own.append(self.times[rank, step])
                peers.append({p: self.times[p, step] for p in ranks if (p, step) in self.times})
        return measurably_slower(own, peers)

    def peer_ranks(self, rank: int) -> set[int]:
        """Every rank that was its peer in some analysed step."""
        return set().union(*(set(p) for _, p in self.steps[rank]))


SPREAD_FACTOR = 3.0  # extra own time beyond this many of the peers' step-to-step standard deviations


class Slower(NamedTuple):
    measurable: bool | None  # None: no peers, or fewer than two steps with them, to judge by
    extra_ns: int | None  # median over steps of its own time minus its peers' median
    spread_ns: int | None  # the peers' step-to-step standard deviation (robust)
    num_slower: int  # steps in which its extra own time exceeded SPREAD_FACTOR x spread_ns
    num_steps: int  # steps with peers
    num_peers: int


def measurably_slower(own: list[int], peers: list[dict[int, int]]) -> Slower:
    """Whether a rank is slower than its peers beyond their own noise. own[s] is its own time in
    step s, peers[s] its peers' then (rank -> ns). Its extra time in a step is its own minus the
    median of its peers'; the noise is how much a peer's time changes from one step to the next
    (1.4826 x the median absolute change over sqrt(2): a robust standard deviation of one step's
    time, which the slow rank itself cannot inflate, as a spread across the ranks would). Measurable
    when the extra time exceeds SPREAD_FACTOR x that in at least CONSISTENT_FRAC of the steps, and
    in two steps at least: with Gaussian noise and 1-3 peers, one step does it by chance 1-2% of
    the time, three of three a few times in a million; a rank slow in one step of three is not
    measurably slower."""
    steps = [(w, list(p.values())) for w, p in zip(own, peers) if p]
    num_peers = len(set().union(*(p.keys() for p in peers)))
    if not steps:
        return Slower(None, None, None, 0, 0, num_peers)
    extra = [w - statistics.median(p) for w, p in steps]
    changes = [abs(b[r] - a[r]) for a, b in zip(peers, peers[1:]) for r in a.keys() & b.keys()]
    if len(steps) < 2 or not changes:
        return Slower(None, int(statistics.median(extra)), None, 0, len(steps), num_peers)
    spread = 1.4826 * statistics.median(changes) / math.sqrt(2)
    num_slower = sum(e > SPREAD_FACTOR * spread for e in extra)
    return Slower(num_slower >= CONSISTENT_FRAC * len(steps), int(statistics.median(extra)), int(spread), num_slower,
                  len(steps), num_peers)


def _small_rank_finding(rank: int, s, lost_ns: int, cause: str, slower: Slower, threshold: float,
                        steps: list[int]) -> Finding:
    """A rank measurably slower than its peers whose cost is under the flag threshold."""
    _, host, imposed, last_frac, _, _, _, _ = s
    return Finding(
        "info",
        f"Small straggler: rank {rank} ({cause}) spends {slower.extra_ns / 1e6:.2f} ms more per step than its peers "
        f"outside communication; the step would be {lost_ns / 1e6:.2f} ms shorter without it",
        _ADVICE[cause],
        f"Rank {rank}'s own time (its step less exposed communication: compute, host-side and copy time) exceeded "
        f"the median of its {slower.num_peers} peers' (same pipeline stage and collectives) by "
        f"{slower.extra_ns / 1e6:.2f} ms per step (median), and by more than {SPREAD_FACTOR:g} x their step-to-step "
        f"spread ({slower.spread_ns / 1e6:.3f} ms) in {slower.num_slower} of {slower.num_steps} steps. Counterfactual: it works like the median of its peers at each instance and the "
        f"step is replayed from the matched collectives: the job's step gets {lost_ns / 1e6:.2f} ms shorter (median "
        f"over steps), under the flag threshold of {threshold / 1e6:.2f} ms. It arrived last at "
        f"{100 * (last_frac or 0):.0f}% of its collectives and made its peers wait {imposed / 1e6:.2f} ms per step.",
        lost_ns, {"ranks": [rank], "steps": steps, "host": host, "cause": cause, "extra_own_ns": slower.extra_ns,
                  "spread_ns": slower.spread_ns, "num_peers": slower.num_peers})


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


@numba.njit(cache=True, nogil=True)
def _median_by_run(key, values, n):  # pragma: no cover - compiled
    """For rows sorted by key (0..n-1): per key, the median of its values that are not NaN (NaN when none)."""
    out = np.full(n, np.nan)
    i = 0
    while i < len(key):
        j = i
        while j < len(key) and key[j] == key[i]:
            j += 1
        chunk = values[i:j]
        chunk = chunk[~np.isnan(chunk)]
        if len(chunk):
            out[key[i]] = np.median(chunk)
        i = j
    return out


def _host_candidates(stats) -> dict[str, set[int]]:
    """The hosts whose ranks impose the most wait (a slow host rather than one slow worker is priced
    with all its ranks at once); none on a single-host run."""
    hosts: dict[str, set[int]] = {}
    for rank, s in stats.items():
        if s[1] is not None:
            hosts.setdefault(s[1], set()).add(rank)
    if len(hosts) < 2:
        return {}
    imposed = {h: sum(stats[r][2] or 0 for r in ranks) for h, ranks in hosts.items()}
    return {h: hosts[h] for h in sorted(hosts, key=lambda h: -imposed[h])[:MAX_HOST_CANDIDATES] if imposed[h] > 0}


def _host_findings(hosts: dict[str, set[int]], stats, single: dict, host_lost: dict, threshold: float,
                   median_step: float, steps: list[int]) -> list[Finding]:
    """A slow host: all its ranks together cost clearly more than its worst one."""
    out = []
    for host, ranks in hosts.items():
        best_single = max((single.get(r) or 0) for r in ranks)
        cost = host_lost[host]
        if cost >= threshold and cost > 1.5 * best_single:
            cause = _host_cause([stats[r] for r in ranks], _medians(stats))
            out.append(Finding(
                severity_for(cost, median_step),
                f"Slow host: {host} ({len(ranks)} ranks, {cause}) costs {cost / 1e6:.2f} ms per step, more than any one of its ranks",
                _HOST_ADVICE[cause],
                f"Counterfactual: every rank of {host} works like the median rank of its role elsewhere; the step gets "
                f"{cost / 1e6:.2f} ms shorter, against {best_single / 1e6:.2f} ms for its worst single rank.",
                cost, {"ranks": sorted(ranks), "steps": steps, "host": host, "cause": cause}))
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


def _link_candidates(con, run_id: int) -> dict[str, tuple[float, np.ndarray]]:
    """Slow links: inter-host transfers touching a host are slower than the same op and size between
    other hosts. A group spanning two hosts cannot tell which end is slow, so a host's ratio is the
    lowest over the (op, size) classes it takes part in: only a host slow in every class stands out.
    Returns, for the hosts at or above MIN_LINK_RATIO (the highest MAX_HOST_CANDIDATES), the ratio
    and the inter-host instances they join."""
    # one numbering of the hosts, used by the pairs and to name the hosts found
    host_names = [h for (h,) in con.execute(
        "SELECT DISTINCT host FROM ranks WHERE run_id = ? AND host IS NOT NULL ORDER BY host", [run_id]).fetchall()]
    # the hosts of each inter-host instance from its group's ranks (its sender and receiver for
    # p2p): a complete instance's members are exactly those, and reading them from the 43 million
    # member rows at 10,240 ranks cost 2-3 times as much
    pairs = {k: np.asarray(v) for k, v in con.execute("""
        WITH hosts AS (
            SELECT host, CAST(row_number() OVER (ORDER BY host) - 1 AS INTEGER) AS host_id
            FROM (SELECT DISTINCT host FROM ranks WHERE run_id = $1 AND host IS NOT NULL)
        ), rank_hosts AS (
            SELECT r.rank, h.host_id FROM ranks r JOIN hosts h USING (host) WHERE r.run_id = $1
        ), spanning AS (
            SELECT instance_id, pg_name, is_p2p, dense_rank() OVER (ORDER BY op, bytes) AS class_id, transfer_ns
            FROM collperf_instances WHERE run_id = $1 AND spans_hosts AND transfer_ns > 0
        ), group_hosts AS (
            -- a complete collective's members are its group's ranks
            SELECT DISTINCT g.pg_name, h.host_id
            FROM (SELECT pg_name, unnest(any_value(pg_ranks)) AS rank FROM match_instances
                  WHERE run_id = $1 AND NOT is_p2p AND status = 'complete'
                    AND pg_name IN (SELECT pg_name FROM spanning WHERE NOT is_p2p)
                  GROUP BY pg_name) g
            JOIN rank_hosts h USING (rank)
        )
        SELECT s.instance_id, g.host_id, s.class_id, s.transfer_ns
        FROM spanning s JOIN group_hosts g USING (pg_name) WHERE NOT s.is_p2p
        UNION ALL
        -- a complete send/recv's members are its sender and receiver
        SELECT DISTINCT p.instance_id, h.host_id, p.class_id, p.transfer_ns
        FROM (SELECT s.*, unnest([i.src_rank, i.dst_rank]) AS rank
              FROM spanning s JOIN match_instances i ON i.run_id = $1 AND i.instance_id = s.instance_id
              WHERE s.is_p2p) p
        JOIN rank_hosts h USING (rank)""",
        [run_id]).fetchnumpy().items()}
    if not len(pairs["instance_id"]):
        return {}
    ratios = {}
    for cls in np.unique(pairs["class_id"]).tolist():
        sel = pairs["class_id"] == cls
        inst, first = np.unique(pairs["instance_id"][sel], return_index=True)
        values = pairs["transfer_ns"][sel][first]
        order = np.argsort(values, kind="stable")
        sorted_values, position = values[order], np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        where = np.searchsorted(inst, pairs["instance_id"][sel])
        hosts = pairs["host_id"][sel]
        by_host = np.argsort(hosts, kind="stable")
        bounds = np.flatnonzero(np.r_[True, hosts[by_host][1:] != hosts[by_host][:-1], True])
        for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            touching = np.sort(position[where[by_host[lo:hi]]])
            if len(touching) == len(sorted_values):
                continue  # the host joins every instance of the class: nothing to compare with
            other = _median_without(sorted_values, touching)
            ratio = float(np.median(sorted_values[touching])) / other if other > 0 else 0.0
            host = int(hosts[by_host[lo]])
            ratios[host] = min(ratios.get(host, ratio), ratio)
    out = {}
    for host, ratio in sorted(ratios.items(), key=lambda kv: -kv[1])[:MAX_HOST_CANDIDATES]:
        if ratio < MIN_LINK_RATIO:
            break
        out[host_names[host]] = (ratio, np.unique(pairs["instance_id"][pairs["host_id"] == host]))
    return out


def _median_without(sorted_values: np.ndarray, excluded: np.ndarray) -> float:
    """The median of sorted_values without the (sorted, distinct, not all) positions `excluded`:
    the middle kept positions found by searchsorted, never a copy of the rest (a host's call, 2,560
    of them at 10,240 ranks, copied 1.3 s worth)."""
    kept = len(sorted_values) - len(excluded)

    def nth_kept(k: int) -> int:
        # the smallest p with p = k + (excluded positions <= p): the k-th kept position
        p = k
        while (q := k + int(np.searchsorted(excluded, p, side="right"))) != p:
            p = q
        return p

    return float((sorted_values[nth_kept((kept - 1) // 2)] + sorted_values[nth_kept(kept // 2)]) / 2)


def _link_findings(con, run_id: int, links: dict[str, tuple[float, int]], threshold: float, median_step: float,
                   steps: list[int]) -> list[Finding]:
    out = []
    for host, (ratio, link_lost) in links.items():
        if link_lost >= threshold:
            out.append(Finding(
                severity_for(link_lost, median_step),
                f"Slow link: inter-host transfers of {host} take {ratio:.1f}x as long as the same ops between other hosts",
                "Check this host's network path (NIC, cables, switch port, PCIe/NVLink errors, congestion).",
                f"Counterfactual: its inter-host transfers at the speed of the same op and size elsewhere (divided by "
                f"{ratio:.2f}); the step gets {link_lost / 1e6:.2f} ms shorter.",
                link_lost, {"ranks": sorted(r for (r,) in con.execute(
                    "SELECT rank FROM ranks WHERE run_id = ? AND host = ?", [run_id, host]).fetchall()),
                    "steps": steps, "host": host, "cause": "link"}))
    return out
