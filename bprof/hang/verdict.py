"""The hang verdict: which ranks stall the job, doing what, and why the others wait.

Reads a `JobDumps` (bprof.hang.dumps); returns a `Verdict` whose `to_json()` is the shape
`bprof hang --json` prints.

Algorithm:
1. Per process group (collectives only; p2p calls have their own sequence), each member's last
   enqueued / started / completed sequence number: the dump's pg_status where it has one, raised to
   what its entries show (a completed or retired entry). A member without a usable dump is
   `no_dump` (or `dead` when the launcher saw it exit).
2. A group is stuck when some member has an enqueued collective it has not completed, when its
   members stand at different sequence numbers, or when a member left no dump. Its front
   M is the highest sequence number any member enqueued; members that enqueued M and have not
   completed it are `waiting`; members that completed it are `ahead`; members whose last call is
   M-1 (completed) are `not_joined`; members further back, or stuck in an earlier call, `behind`.
3. Mismatch: at every sequence number of a group, the members' entries must agree on op, input
   and output sizes, dtypes. The members against the majority are `mismatch` at the first
   sequence number where they differ.
4. Culprits: in each stuck group the waiting members wait for the group's blamed members
   (not_joined, behind, no_dump, dead, mismatch). A blamed rank that is itself waiting in another
   stuck group is a victim; following these "waits for" edges, the culprits are the ranks where
   they end (the terminal strongly connected components: one rank, or a cycle of ranks that wait
   for each other, e.g. groups entered in opposite orders).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from bprof.hang.dumps import NO_SEQ, Entry, JobDumps

REASONS = ("dead", "mismatch", "not_joined", "behind", "no_dump")  # most telling first
STACK_FRAMES = 8  # top frames of a culprit's training thread in the verdict


@dataclass
class Member:
    rank: int
    status: str  # waiting, ahead, not_joined, behind, no_dump, dead, idle (group not stuck)
    last_enqueued: int | None
    last_started: int | None
    last_completed: int | None


@dataclass
class Group:
    name: str
    desc: str
    ranks: list[int]
    stuck: bool
    stuck_seq: int | None
    stuck_op: str | None
    members: list[Member]
    mismatched: list[int] = field(default_factory=list)

    def with_status(self, *statuses: str) -> list[int]:
        return [m.rank for m in self.members if m.status in statuses]

    def blamed(self) -> dict[int, str]:
        """The members the group waits for. After a mismatch the sequence numbers no longer line up
        (gloo pairs the calls by order), so there only the mismatched members and those without a
        dump are blamed."""
        lagging = ("no_dump", "dead") if self.mismatched else ("not_joined", "behind", "no_dump", "dead")
        out = {m.rank: m.status for m in self.members if m.status in lagging}
        for r in self.mismatched:
            out[r] = "mismatch" if out.get(r) != "dead" else "dead"
        return out


@dataclass
class Culprit:
    rank: int
    reason: str
    process_group: str
    last_seq: int | None
    stack: list[str]
    last_collective: str
    groups: list[str]  # the stuck groups it explains
    late_before: bool | None = None  # late in the step window captured before the hang (None: no such window)


@dataclass
class Verdict:
    verdict: str
    culprits: list[Culprit]
    groups: list[Group]
    mismatches: list[dict]
    notes: list[str]
    # the straggler analysis of a step window captured before the hang (bprof.hang.before.Before.to_json)
    before: dict | None = None

    def to_json(self) -> dict:
        """The shape of issue 22's `--json`; with a window captured before the hang (bprof.hang.before)
        also `before` and each culprit's `late_before`."""
        joined = self.before is not None
        out = {
            "verdict": self.verdict,
            "culprits": [{"rank": c.rank, "reason": c.reason, "process_group": c.process_group,
                          "last_seq": c.last_seq, "stack": c.stack}
                         | ({"late_before": c.late_before} if joined else {}) for c in self.culprits],
            "groups": [{"process_group": g.name, "desc": g.desc, "ranks": g.ranks, "stuck": g.stuck,
                        "stuck_seq": g.stuck_seq, "stuck_op": g.stuck_op,
                        "waiting": g.with_status("waiting"), "ahead": g.with_status("ahead"),
                        "not_joined": g.with_status("not_joined"), "behind": g.with_status("behind"),
                        "no_dump": g.with_status("no_dump"), "dead": g.with_status("dead"),
                        "mismatched": g.mismatched,
                        "members": [m.__dict__ for m in g.members]} for g in self.groups],
            "mismatches": self.mismatches,
        }
        if joined:
            out["before"] = self.before
        return out


def analyze(job: JobDumps) -> Verdict:
    """The verdict for one stuck (or dead) job."""
    notes = [f"rank {r}: dump {d.problem}" + (f" ({d.path})" if d.path else "")
             for r, d in sorted(job.dumps.items()) if not d.ok]
    notes += [f"rank {r}: alive but did not answer the request for its dump (GIL held, or blocked in C++)"
              + ("; native stack captured" if r in job.stacks else "") for r in job.unresponsive]
    groups, mismatches = [], []
    for name in _group_names(job):
        group, group_mismatches = _group(job, name)
        groups.append(group)
        mismatches += group_mismatches
    culprits = _culprits(job, groups)
    return Verdict(_sentence(job, culprits, groups), culprits, groups, mismatches, notes)


def _group_names(job: JobDumps) -> list[str]:
    names = set(job.pg_ranks)
    for d in job.dumps.values():
        names |= {e.pg_name for e in d.entries if not e.is_p2p} | set(d.pg_status)
    return sorted(names, key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n))


def _members(job: JobDumps, name: str) -> list[int]:
    if name in job.pg_ranks:
        return sorted(job.pg_ranks[name])
    desc = job.pg_desc.get(name, "")
    if desc == "default_pg" or name == "0" and not desc:
        return list(range(job.world_size))
    return sorted(r for r, d in job.dumps.items()
                  if name in d.pg_status or any(e.pg_name == name for e in d.entries))


def _progress(entries: list[Entry], status) -> tuple[int, int, int]:
    enq = max([e.seq for e in entries] + [status.last_enqueued if status else NO_SEQ, 0])
    started = max([e.seq for e in entries if e.state in ("started", "completed")]
                  + [status.last_started if status else NO_SEQ, NO_SEQ])
    done = max([e.seq for e in entries if e.completed] + [status.last_completed if status else NO_SEQ, 0])
    if any(e.seq == enq for e in entries):  # a call was made after the one before it returned
        done = max(done, enq - 1)
    return enq, started, done


def _group(job: JobDumps, name: str) -> tuple[Group, list[dict]]:
    ranks = _members(job, name)
    per_rank = {}
    for r in ranks:
        d = job.dumps.get(r)
        if d is None or not d.ok:
            continue
        entries = [e for e in d.entries if e.pg_name == name and not e.is_p2p]
        per_rank[r] = (entries, _progress(entries, d.pg_status.get(name)))
    enqueued = [p[0] for _, p in per_rank.values()]
    front = max(enqueued, default=0)
    in_flight = any(p[0] > p[2] for _, p in per_rank.values())
    # a member without a dump while the others made calls: the one unknown is where they stopped
    # (gloo counts a call that failed because its peer vanished as completed)
    silent = any(r not in per_rank for r in ranks) and front > 0
    stuck = in_flight or len(set(enqueued)) > 1 or silent
    # the first collective not every member (with a dump) enqueued, else the one not all completed
    at = min(enqueued) + 1 if len(set(enqueued)) > 1 else front
    members = []
    for r in ranks:
        if r not in per_rank:
            members.append(Member(r, "dead" if r in job.dead else "no_dump", None, None, None))
            continue
        enq, started, done = per_rank[r][1]
        if not stuck:
            status = "idle"
        elif enq < at:
            status = "not_joined" if front == at else "behind"
        elif enq > at:
            status = "ahead"
        else:  # a "completed" seq the laggards never enqueued is a wait that timed out (gloo counts it done)
            status = "waiting"
        if r in job.dead:
            status = "dead"
        members.append(Member(r, status, enq, None if started == NO_SEQ else started, done))
    mismatches = _mismatches(name, {r: p[0] for r, p in per_rank.items()})
    first = min((m["seq"] for m in mismatches), default=None)
    mismatched = sorted({m["rank"] for m in mismatches if m["seq"] == first})
    stuck_op = None
    for entries, _ in per_rank.values():
        for e in entries:
            if e.seq == at:
                stuck_op = e.op
    desc = job.pg_desc.get(name, "")
    return Group(name, desc, ranks, stuck or bool(mismatched), at if stuck else None,
                 stuck_op if stuck else None, members, mismatched), mismatches


def _mismatches(name: str, entries: dict[int, list[Entry]]) -> list[dict]:
    """Members whose entry at a sequence number disagrees with the majority's (op, sizes, dtypes)."""
    by_seq: dict[int, dict[int, Entry]] = {}
    for r, es in entries.items():
        for e in es:
            by_seq.setdefault(e.seq, {})[r] = e
    out = []
    for seq in sorted(by_seq):
        at = by_seq[seq]
        if len(at) < 2:
            continue
        counts = Counter(e.signature() for e in at.values())
        if len(counts) == 1:
            continue
        # the majority; on a tie, the signature of the lowest rank
        best = max(counts.values())
        majority = next(e.signature() for _, e in sorted(at.items()) if counts[e.signature()] == best)
        majority_ranks = sorted(r for r, e in at.items() if e.signature() == majority)
        for r, e in sorted(at.items()):
            if e.signature() != majority:
                out.append({"process_group": name, "seq": seq, "rank": r,
                            "expected": _sig_json(majority), "actual": _sig_json(e.signature()),
                            "majority_ranks": majority_ranks,
                            "differs_in": [k for k, a, b in zip(("op", "input_sizes", "output_sizes", "dtypes"),
                                                                majority, e.signature()) if a != b]})
    return out


def _sig_json(sig: tuple) -> dict:
    op, ins, outs, dtypes = sig
    return {"op": op, "input_sizes": [list(s) for s in ins], "output_sizes": [list(s) for s in outs],
            "dtypes": list(dtypes)}


def _culprits(job: JobDumps, groups: list[Group]) -> list[Culprit]:
    stuck = [g for g in groups if g.stuck]
    blamed_in: dict[int, list[tuple[Group, str]]] = {}
    waits_for: dict[int, set[int]] = {}
    for g in stuck:
        blamed = g.blamed()
        for r, reason in blamed.items():
            blamed_in.setdefault(r, []).append((g, reason))
        waiting = ("waiting", "behind", "ahead", "not_joined") if g.mismatched else ("waiting", "behind", "ahead")
        for r in g.with_status(*waiting):
            if r in g.mismatched:
                continue
            waits_for.setdefault(r, set()).update(b for b in blamed if b != r)
    # terminal strongly connected components of the waits-for graph, reached from the blamed ranks
    reach = _reachable(set(blamed_in), waits_for)
    roots = [c for c in _sccs(reach, waits_for) if not any(n not in c for r in c for n in waits_for.get(r, ()))]
    culprits = []
    for comp in roots:
        for r in sorted(comp):
            if r not in blamed_in:
                continue
            g, reason = min(blamed_in[r], key=lambda gr: REASONS.index(gr[1]))
            culprits.append(Culprit(r, reason, g.name, _last_seq(job, r, g), job.stacks.get(r, [])[:STACK_FRAMES],
                                    _last_collective(job, r), [gg.name for gg, _ in blamed_in[r]]))
    named = {c.rank for c in culprits}
    for r, why in sorted(job.dead.items()):  # died, and no dump says which group it left waiting
        if r not in named and r not in blamed_in:
            culprits.append(Culprit(r, "dead", "", None, job.stacks.get(r, [])[:STACK_FRAMES],
                                    _last_collective(job, r), []))
    explained = {g.name for c in culprits for g in stuck if _explains(c.rank, g, waits_for)}
    culprits.sort(key=lambda c: (REASONS.index(c.reason), -len([g for g in stuck if g.name in explained
                                                                 and _explains(c.rank, g, waits_for)]), c.rank))
    return culprits


def _explains(rank: int, group: Group, waits_for: dict[int, set[int]]) -> bool:
    """Does the rank stall the group, directly or through the ranks the group waits for?"""
    return rank in _reachable(set(group.blamed()), waits_for)


def _reachable(start: set[int], edges: dict[int, set[int]]) -> set[int]:
    seen, todo = set(start), list(start)
    while todo:
        for n in edges.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def _sccs(nodes: set[int], edges: dict[int, set[int]]) -> list[set[int]]:
    """Strongly connected components (Kosaraju; the graphs have one node per rank)."""
    order, seen = [], set()
    for start in sorted(nodes):
        if start in seen:
            continue
        stack = [(start, iter(sorted(edges.get(start, ()))))]
        seen.add(start)
        while stack:
            node, it = stack[-1]
            nxt = next((n for n in it if n in nodes and n not in seen), None)
            if nxt is None:
                order.append(node)
                stack.pop()
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(edges.get(nxt, ())))))
    reverse: dict[int, set[int]] = {}
    for a in nodes:
        for b in edges.get(a, ()):
            if b in nodes:
                reverse.setdefault(b, set()).add(a)
    comps, assigned = [], set()
    for node in reversed(order):
        if node in assigned:
            continue
        comp, todo = set(), [node]
        assigned.add(node)
        while todo:
            n = todo.pop()
            comp.add(n)
            for m in reverse.get(n, ()):
                if m not in assigned:
                    assigned.add(m)
                    todo.append(m)
        comps.append(comp)
    return comps


def _last_seq(job: JobDumps, rank: int, group: Group) -> int | None:
    member = next(m for m in group.members if m.rank == rank)
    if member.last_enqueued is not None:
        return member.last_enqueued
    # no dump: its peers completed everything before the stuck collective, which needed it
    return group.stuck_seq - 1 if group.stuck_seq is not None else None


def _last_collective(job: JobDumps, rank: int) -> str:
    d = job.dumps.get(rank)
    if d is None or not d.ok or not d.entries:
        return "unknown (no dump)" if d is None or not d.ok else "none recorded"
    e = max(d.entries, key=lambda e: (e.time_created_ns or 0, e.record_id))
    return describe(e, job)


def describe(e: Entry, job: JobDumps | None = None) -> str:
    desc = (job.pg_desc.get(e.pg_name) if job else None) or e.pg_desc
    where = f"group {e.pg_name}" + (f" ({desc})" if desc and desc != e.pg_name else "")
    sizes = ",".join("x".join(map(str, s)) or "scalar" for s in e.input_sizes)
    state = "completed" if e.completed else e.state
    return f"{e.op} #{e.seq} of {where} [{sizes}{' ' + e.dtypes[0] if e.dtypes else ''}] {state}"


def _sentence(job: JobDumps, culprits: list[Culprit], groups: list[Group]) -> str:
    stuck = [g for g in groups if g.stuck]
    if not any(d.ok for d in job.dumps.values()) and not job.dead:
        return "no usable Flight Recorder dump (see the notes): nothing to judge by"
    if not stuck and not job.dead:
        return "no stuck process group: every member that left a dump completed what it enqueued"
    if not culprits:
        names = ", ".join(_gname(g) for g in stuck)
        return f"stuck in {names}, but every member reached the stuck collective: no rank to blame from the dumps"
    parts = []
    for c in culprits:
        g = next((g for g in groups if g.name == c.process_group), None)
        if g is None:
            parts.append(f"rank {c.rank} died ({job.dead.get(c.rank, 'exited')})")
            continue
        what = {"not_joined": f"never joined {g.stuck_op or 'collective'} #{g.stuck_seq} of {_gname(g)}",
                "behind": f"is behind in {_gname(g)} (at #{c.last_seq}, the group at #{g.stuck_seq})",
                "mismatch": f"called a different collective than its peers in {_gname(g)}",
                "dead": f"died (ended: {job.dead.get(c.rank, 'exited')}) with {_gname(g)} waiting",
                "no_dump": f"left no dump and {_gname(g)} waits for it at #{g.stuck_seq}"}[c.reason]
        parts.append(f"rank {c.rank} {what}")
    n = len(stuck)
    return "; ".join(parts) + (f" ({n} stuck group{'s' if n != 1 else ''})" if n else "")


def _gname(g: Group) -> str:
    return f"group {g.name}" + (f" ({g.desc})" if g.desc and g.desc != g.name else "")
