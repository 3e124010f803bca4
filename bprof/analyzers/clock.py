"""How far is each host's clock from the run's reference clock? One offset per host, from the
clock-sync samples of `bprof record`, refined by the exits of symmetric collectives.

Reads ranks, clock_samples, match_instances, match_members; writes clock_hosts, fills
ranks.clock_offset_ns / clock_residual_ns, which give match_members_aligned.arrival_aligned_ns /
end_aligned_ns (definitions in clock.sql and match.sql).
"""

from __future__ import annotations

import dataclasses
import heapq
import math

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql

NAME = "clock"
TABLES = ["clock_hosts"]
MIN_EXITS = 3  # observations a pair of hosts needs before its exits count (a median of fewer is a guess)


@dataclasses.dataclass(frozen=True)
class Edge:
    """off(dst) = off(src) + delta_ns, with an error of residual_ns."""

    src: str
    dst: str
    delta_ns: int
    residual_ns: int
    kind: str  # samples, exits, p2p_exits


@dataclasses.dataclass(frozen=True)
class Bounds:
    """What a host's clock samples say: off(host) = off(ref_host) + offset_ns, within [lo_ns, hi_ns]."""

    ref_host: str
    offset_ns: int
    residual_ns: int
    lo_ns: int
    hi_ns: int


@dataclasses.dataclass
class Solution:
    offset_ns: int | None
    residual_ns: int | None
    method: str
    via_host: str | None = None
    rejected_exits_ns: int | None = None  # an exits estimate outside the samples' bounds


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    con.execute("UPDATE ranks SET clock_offset_ns = NULL, clock_residual_ns = NULL WHERE run_id = ?", [run_id])
    run_sql(con, "clock.sql", run_id)
    hosts = [h for (h,) in con.execute(
        "SELECT host FROM _clock_domains GROUP BY host ORDER BY min(rank)").fetchall()]
    if not hosts:
        return Result(NAME, TABLES)
    edges, bounds = _edges(con)
    solution = solve(hosts, edges, bounds)
    con.execute("CREATE OR REPLACE TEMP TABLE _clock_solution (host VARCHAR, offset_ns BIGINT, residual_ns BIGINT, "
                "method VARCHAR, via_host VARCHAR)")
    con.execute("""INSERT INTO _clock_solution
                   SELECT unnest($1), unnest($2), unnest($3), unnest($4), unnest($5)""",
                [hosts, [solution[h].offset_ns for h in hosts], [solution[h].residual_ns for h in hosts],
                 [solution[h].method for h in hosts], [solution[h].via_host for h in hosts]])
    run_sql(con, "clock_apply.sql", run_id)
    return Result(NAME, TABLES, _findings(hosts, solution, bounds))


def _edges(con: duckdb.DuckDBPyConnection) -> tuple[list[Edge], dict[str, Bounds]]:
    edges, bounds = [], {}
    for host, ref_host, offset_ns, residual_ns, lo_ns, hi_ns, _ in con.execute(
            "SELECT * FROM _clock_sample_edges ORDER BY host, ref_host").fetchall():
        edges.append(Edge(ref_host, host, offset_ns, residual_ns, "samples"))
        bounds.setdefault(host, Bounds(ref_host, offset_ns, residual_ns, lo_ns, hi_ns))
    # own(b) + off(b) = own(a) + off(a) at a shared exit, so off(b) = off(a) - (end(b) - end(a))
    for kind, anchor, host, d_ns, residual_ns in con.execute(
            "SELECT kind, anchor, host, d_ns, residual_ns FROM _clock_exit_edges WHERE num_obs >= ? ORDER BY ALL",
            [MIN_EXITS]).fetchall():
        edges.append(Edge(anchor, host, -d_ns, residual_ns, kind))
    return edges, bounds


def solve(hosts: list[str], edges: list[Edge], bounds: dict[str, Bounds]) -> dict[str, Solution]:
    """Offsets of every host relative to hosts[0].

    Algorithm: Dijkstra from the reference over the graph of hosts, edges walked both ways, a path
    costing (whether it needs a send/recv exit, sum of squared residuals): each host gets the chain
    of estimates with the least error, send/recv exits only where nothing else links it. A host
    reached through exits whose own clock samples bound its offset keeps the exits' estimate only
    inside those bounds (then method samples+exits); outside them the samples win.
    """
    adjacent: dict[str, list[tuple[str, int, int, str]]] = {h: [] for h in hosts}
    for e in edges:
        if e.src in adjacent and e.dst in adjacent:
            adjacent[e.src].append((e.dst, e.delta_ns, e.residual_ns, e.kind))
            adjacent[e.dst].append((e.src, -e.delta_ns, e.residual_ns, e.kind))
    reference = hosts[0]
    solution = {h: Solution(None, None, "none") for h in hosts}
    done: set[str] = set()
    # (p2p tier, variance, host, push order, offset, kinds of edges on the path, via, kind of the last edge)
    queue = [(0, 0, reference, 0, 0, frozenset(), None, None)]
    pushed = 0
    while queue:
        tier, var, host, _, offset, kinds, via, last_kind = heapq.heappop(queue)
        if host in done:
            continue
        done.add(host)
        residual = round(math.sqrt(var))
        method = _method(kinds)
        rejected = None
        b = bounds.get(host)
        own_samples = last_kind == "samples" and via == (b.ref_host if b else None)
        if b and not own_samples and b.ref_host in done and solution[b.ref_host].offset_ns is not None:
            base = solution[b.ref_host].offset_ns
            if b.lo_ns <= b.hi_ns and base + b.lo_ns <= offset <= base + b.hi_ns:
                method = "samples+exits"
                residual = min(residual, max(offset - base - b.lo_ns, base + b.hi_ns - offset))
            else:
                rejected = offset
                offset, via, kinds = base + b.offset_ns, b.ref_host, frozenset({"samples"})
                var = solution[b.ref_host].residual_ns ** 2 + b.residual_ns ** 2
                residual, method = round(math.sqrt(var)), "samples"
        solution[host] = Solution(offset, residual, "reference" if host == reference else method, via, rejected)
        for other, delta, res, kind in adjacent[host]:
            if other not in done:
                pushed += 1
                heapq.heappush(queue, (max(tier, int(kind == "p2p_exits")), var + res * res, other, pushed,
                                       offset + delta, kinds | {kind}, host, kind))
    return solution


def _method(kinds: frozenset) -> str:
    if "p2p_exits" in kinds:
        return "p2p_exits"
    if kinds == {"samples"}:
        return "samples"
    if "samples" in kinds:
        return "samples+exits"
    return "exits" if kinds else "reference"


def _findings(hosts: list[str], solution: dict[str, Solution], bounds: dict[str, Bounds]) -> list[Finding]:
    findings = []
    lost = [h for h in hosts if solution[h].offset_ns is None]
    if lost:
        findings.append(not_measurable(
            f"Clocks of {len(lost)} of {len(hosts)} hosts cannot be aligned: arrival skew, waits and transfer "
            "times of collectives spanning them are not measured",
            "No clock-sync sample and no matched symmetric collective (or send/recv) links these hosts to the "
            "reference host's clock.",
            "Record with `bprof record` (it ping-pongs every host's clock with rank 0's at the window's start and "
            "end), or trace steps in which the hosts share all-reduces.",
            hosts=lost[:50]))
    rejected = [h for h in hosts if solution[h].rejected_exits_ns is not None]
    if rejected:
        findings.append(Finding(
            "info", f"Collective exits disagree with the clock samples on {len(rejected)} host(s): using the samples",
            "Nothing to fix in the job; cross-host skew on these hosts is only as good as the samples' round trip.",
            "The offsets implied by the exits of symmetric collectives fall outside the bounds every clock-sync "
            "sample allows (members did not finish together: gloo on oversubscribed CPUs, or clock drift).",
            None, {"hosts": rejected[:50],
                   "exits_offset_ns": [solution[h].rejected_exits_ns for h in rejected[:50]],
                   "samples_offset_ns": [solution[h].offset_ns for h in rejected[:50]]}))
    return findings
