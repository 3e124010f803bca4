"""How did each collective perform? Arrival skew, each member's wait for the last peer, transfer
time and nccl-tests bandwidths per matched instance on aligned clocks, aggregated per group, op
and message size; uneven MoE all_to_all becomes an expert-imbalance finding.

The link peak an instance's bus bandwidth is compared with: within a host the slowest member
device's NVLink per direction (bprof/kernels/devices.csv), across hosts the NIC the user gives
(Options.nic_bytes_per_s, `bprof analyze --nic-gbps`); unknown stays NULL.

Reads match_instances, match_members_aligned, ranks, collectives; writes collperf_instances,
collperf_waits, collperf_groups (definitions in collperf.sql). Each member's wait is a row of
collperf_waits (an interval on its own clock, what breakdown intersects); the last member waits 0.
"""

from __future__ import annotations

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql, severity_for
from bprof.analyzers.peaks import rank_device_properties
from bprof.kernels.devices import resolve_device

NAME = "collperf"
TABLES = ["collperf_instances", "collperf_waits", "collperf_groups"]
IMBALANCE_FRAC = 0.2  # all_to_all flagged when the busiest receiver gets >= 1.25x the mean (1 - 1/1.25)


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    _link_peaks(con, run_id, options)
    run_sql(con, "instance_times.sql", run_id)
    run_sql(con, "collperf.sql", run_id)
    return Result(NAME, TABLES, _findings(con, run_id))


def _link_peaks(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> None:
    """_collperf_links(rank, intra_bytes_per_s, inter_bytes_per_s): each rank's device NVLink peak per
    direction (NULL for a device the table has no link for, or no device) and the NIC peak given.
    Resolved once per distinct (device index, device properties): a 10,240-rank job has a handful."""
    con.execute("CREATE OR REPLACE TEMP TABLE _collperf_links (rank INTEGER, intra_bytes_per_s DOUBLE, "
                "inter_bytes_per_s DOUBLE)")
    devices = con.execute("""SELECT device_index, device_properties, list(rank) FROM ranks WHERE run_id = ?
                             GROUP BY ALL""", [run_id]).fetchall()
    ranks, intra = [], []
    for device_index, props_json, device_ranks in devices:
        mine = rank_device_properties(props_json, device_index)
        device = resolve_device(mine) if mine else None
        ranks += device_ranks
        intra += [device.link_bytes_per_s if device else None] * len(device_ranks)
    if ranks:
        con.execute("INSERT INTO _collperf_links SELECT unnest($1), unnest($2), $3",
                    [ranks, intra, options.nic_bytes_per_s])


def _findings(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    findings = []
    complete, measured = con.execute("""
        SELECT (SELECT count(*) FROM match_instances WHERE run_id = $1 AND status = 'complete' AND num_members >= 2),
               (SELECT count(*) FROM collperf_instances WHERE run_id = $1)""", [run_id]).fetchone()
    if complete and measured < complete:
        findings.append(not_measurable(
            f"{complete - measured} of {complete} matched collectives have a member on an unaligned clock: "
            "their skew, waits and transfer times are not measured",
            "Clock alignment found no offset for some hosts (see the clock analyzer's finding).",
            "Record with `bprof record` so every host's clock is sampled against rank 0's.",
            num_instances=complete - measured))
    findings += _expert_imbalance(con, run_id)
    return findings


def _expert_imbalance(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    """MoE all_to_all whose members receive (dispatch) or send (combine) very different byte counts
    (tokens per expert).

    lost_ns counts only the all_to_all itself: with every member receiving and sending the mean, the
    transfer would be bounded by the mean instead of the largest receive or send, i.e. shorter by transfer_ns x
    imbalance_frac (summed per step, median over steps). The expert compute that the busiest rank
    then runs longer (and its peers wait for) is not counted."""
    rows = con.execute("""
        WITH per_step AS (
            SELECT c.pg_name, any_value(i.pg_desc) AS pg_desc, any_value(i.pg_ranks) AS pg_ranks, c.step,
                   sum(c.transfer_ns * c.member_bytes_imbalance_frac) AS lost_ns,
                   median(c.member_bytes_imbalance_frac) AS imbalance_frac, count(*) AS n
            FROM collperf_instances c JOIN match_instances i USING (run_id, instance_id)
            WHERE c.run_id = ? AND c.op = 'all_to_all' AND c.member_bytes_imbalance_frac IS NOT NULL
            GROUP BY c.pg_name, c.step
        )
        SELECT pg_name, any_value(pg_desc), any_value(pg_ranks), median(imbalance_frac), median(lost_ns),
               list(step ORDER BY step), sum(n)
        FROM per_step GROUP BY pg_name HAVING median(imbalance_frac) >= ?
        ORDER BY median(lost_ns) DESC NULLS LAST""", [run_id, IMBALANCE_FRAC]).fetchall()
    if not rows:
        return []
    # the step on the device where it was measured (steps.device_dur_ns), else the CPU range
    step_ns = con.execute("SELECT median(coalesce(device_dur_ns, dur_ns)) FROM steps WHERE run_id = ?", [run_id]).fetchone()[0]
    findings = []
    for pg_name, pg_desc, pg_ranks, frac, lost_ns, steps, n in rows:
        lost = int(lost_ns) if lost_ns is not None else None
        findings.append(Finding(
            severity_for(lost, step_ns) if lost is not None and step_ns else "warning",
            f"Expert imbalance: the busiest rank of group {pg_name} ({pg_desc}) receives or sends "
            f"{1 / (1 - frac):.2f}x the mean all_to_all bytes",
            "Balance the tokens routed to each expert (auxiliary load-balancing loss, capacity factor, "
            "expert-choice or loss-free balancing routers), or place hot experts on more ranks.",
            f"Median over {n} all_to_all instances of 1 - mean/max bytes received (or sent, when larger) per member: "
            f"{frac:.2f}. "
            "Counterfactual behind lost_ns: every member receives and sends the mean, so each all_to_all is shorter by its "
            "transfer time x that fraction (sum per step, median over steps); the longer expert compute on the "
            "busiest rank, and its peers' wait for it, are not counted.",
            lost, {"pg_name": pg_name, "pg_desc": pg_desc, "ranks": pg_ranks, "steps": steps,
                   "imbalance_frac": frac}))
    return findings
