"""Which calls of different ranks are one collective or p2p instance, and which do not match?

Reads collectives, steps, ranks; writes match_instances, match_members and match_nameless_steps
(definitions in match.sql; the timing of instances on one clock from instance_times.sql). A
member missing within the steps every member traced, or members that disagree on op, size or
dtype, become findings: the first step towards diagnosing a hang. Calls that name no process group
are matched in a group inferred from the ranks' call sequences where those agree, and said so.
"""

from __future__ import annotations

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql

NAME = "match"
TABLES = ["match_instances", "match_members", "match_nameless_steps"]
MAX_LISTED = 20  # seqs and steps named in one finding's evidence


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "instance_times.sql", run_id)
    run_sql(con, "match.sql", run_id)
    return Result(NAME, TABLES, _findings(con, run_id))


def _findings(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    findings = []
    findings += _nameless(con, run_id)
    findings += _unknown_peers(con, run_id)
    # One finding per group and kind of problem: a hang or desync repeats on every later seq.
    rows = con.execute("""
        SELECT pg_name, any_value(pg_desc), any_value(pg_ranks), is_p2p, src_rank, dst_rank,
               len(missing_ranks) > 0 AS has_missing,
               count(*), list(seq ORDER BY instance_id)[:$2], list(DISTINCT step ORDER BY step)[:$2],
               list_sort(list_distinct(flatten(list(missing_ranks)))), first(reason ORDER BY instance_id),
               first(op ORDER BY instance_id), first(instance_id ORDER BY instance_id)
        FROM match_instances WHERE run_id = $1 AND status = 'mismatch'
        GROUP BY pg_name, is_p2p, src_rank, dst_rank, has_missing
        ORDER BY has_missing DESC, count(*) DESC""", [run_id, MAX_LISTED]).fetchall()
    for (pg_name, pg_desc, pg_ranks, is_p2p, src, dst, has_missing, count, seqs, steps, missing, reason, op,
         first_id) in rows:
        group = f"group {pg_name}" + (f" ({pg_desc})" if pg_desc else "")
        what = f"send {src} -> {dst} on {group}" if is_p2p else f"{op} on {group}"
        evidence = {"pg_name": pg_name, "pg_desc": pg_desc, "pg_ranks": pg_ranks, "seqs": seqs, "steps": steps,
                    "num_instances": count, "first_instance_id": first_id, "first_reason": reason}
        if is_p2p:
            evidence |= {"src_rank": src, "dst_rank": dst}
        if has_missing:
            findings.append(Finding(
                "critical", f"Ranks {missing} never called {count} {what} that their peers called",
                "A rank that skips a collective its peers entered hangs them (NCCL/gloo timeout): find why "
                "those ranks took another path (a condition on rank or data, an exception, a desynchronised "
                "loop), e.g. with the Flight Recorder dump of the hang.",
                f"First: {reason}. Matched by group and sequence number within the steps every member traced; "
                "calls outside a rank's traced steps are left out as cut by the window, not counted here. "
                "No lost time is claimed: a hang costs the whole job.",
                None, evidence | {"ranks": missing}))
        else:
            findings.append(Finding(
                "warning", f"{count} {what} instance(s) whose members disagree",
                "Members of one collective must call the same op with the same size and dtype; a disagreement is "
                "a desynchronised program (or mismatched sequence numbers) and can hang or corrupt the result.",
                f"First: {reason}. No lost time is claimed.",
                None, evidence | {"ranks": pg_ranks}))
    return findings


def _nameless(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    """What became of the collective calls that name no process group (match_nameless_steps): one
    info finding for those matched as a group inferred from the call sequences, one not_measurable
    for those left unmatched, with the first step's reason."""
    num_ranks = con.execute("SELECT count(*) FROM ranks WHERE run_id = ?", [run_id]).fetchone()[0]
    if num_ranks < 2:
        return []
    findings = []
    for inferred, num_calls, steps, groups, reason in con.execute("""
            SELECT inferred, sum(num_calls), list(step ORDER BY step NULLS FIRST)[:$2],
                   list(DISTINCT ranks ORDER BY ranks)[:$2], first(reason ORDER BY step NULLS FIRST)
            FROM match_nameless_steps WHERE run_id = $1 GROUP BY inferred ORDER BY inferred DESC""",
                                                                  [run_id, MAX_LISTED]).fetchall():
        num_calls = int(num_calls)
        evidence = {"num_calls": num_calls, "steps": steps, "groups": groups}
        if inferred:
            members = " and ".join(str(g) for g in groups)
            findings.append(Finding(
                "info", f"{num_calls} collective calls name no process group: matched as the group of ranks {members}, "
                        "inferred from their call sequences",
                "Nothing to fix; to have groups named, record with `bprof record` or a torch whose traces name the "
                "process group of each collective (torch >= 2.2).",
                "In each of these steps every rank that traced it made the same sequence of such calls (op, size, "
                "dtype, in order), so they are one group and the k-th call in the step on each rank is one instance "
                "(match_instances.group_from = 'sequence'). No lost time is claimed.",
                None, evidence | {"ranks": groups[0] if len(groups) == 1 else None}))
        else:
            findings.append(not_measurable(
                f"{num_calls} collective calls have no process group and their group cannot be inferred: "
                "they are not matched across ranks",
                f"Their trace names no process group, and the ranks' calls do not tell one: first, in step "
                f"{steps[0]}: {reason}. Calls whose sequences disagree are never merged; for them there is no "
                "arrival skew, wait or transfer time, no clock alignment and no straggler attribution.",
                "Record with `bprof record` (it keeps the Flight Recorder's group and sequence number), or with "
                "torch >= 2.2, whose traces name the process group of each collective.",
                **evidence))
    num_p2p = con.execute("""SELECT count(*) FROM collectives WHERE run_id = ? AND is_p2p
                             AND pg_name IS NULL AND pg_ranks IS NULL""", [run_id]).fetchone()[0]
    if num_p2p:
        findings.append(not_measurable(
            f"{num_p2p} send/recv calls have no process group: they are not matched across ranks",
            "Their trace names no process group, and a group is inferred from call sequences for collectives "
            "only (a send and its recv are different calls). For them there is no arrival skew, wait or transfer "
            "time and no straggler attribution.",
            "Record with `bprof record`, or with a torch whose traces name the process group and the peer of "
            "each send/recv.", num_calls=num_p2p))
    return findings


def _unknown_peers(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    """One finding per group whose send/recv calls stay unmatched because their peer is unknown
    (a group of more than two ranks, and neither the trace nor bprof record named the peer)."""
    findings = []
    for pg_name, pg_desc, num_calls, num_instances, ranks, steps in con.execute("""
            SELECT pg_name, any_value(pg_desc), sum(num_members), count(*),
                   list(DISTINCT coalesce(src_rank, dst_rank) ORDER BY coalesce(src_rank, dst_rank)),
                   list(DISTINCT step ORDER BY step)[:$2]
            FROM match_instances WHERE run_id = $1 AND status = 'unknown'
            GROUP BY pg_name ORDER BY pg_name""", [run_id, MAX_LISTED]).fetchall():
        group = f"group {pg_name}" + (f" ({pg_desc})" if pg_desc else "")
        findings.append(Finding(
            "warning", f"{num_calls} send/recv calls on {group} stay unmatched: their peer is unknown",
            "Record with `bprof record` (its p2p log names each message's peer), or with a torch whose traces "
            "write the peer on send/recv (record_param_comms `Dst Rank` / `Src Rank`).",
            f"The group has more than two ranks and the trace names no peer, so a send cannot be paired with its "
            f"recv ({num_instances} unmatched halves on ranks {ranks}). For these calls there is no arrival skew, "
            "wait or transfer time, no clock alignment and no straggler attribution, and the what-if step graph "
            "runs them as each rank's own work, not joined across ranks. No lost time is claimed.",
            None, {"pg_name": pg_name, "pg_desc": pg_desc, "num_calls": num_calls, "num_instances": num_instances,
                   "ranks": ranks, "steps": steps}))
    return findings
