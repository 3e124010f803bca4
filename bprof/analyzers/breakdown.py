"""Where does each rank's step time go? The partition, comm–compute overlap, communication by
parallel dimension, and findings for exposed communication and idle time.

Reads timeline_spans, events (communication kernels outside c10d too), collectives, and
collperf_waits when cross-rank analysis ran (to split exposed communication into waiting for the
last peer and transfer: waits.py); writes
breakdown_steps, breakdown_ranks, breakdown_groups, breakdown_dims, breakdown_idle_gaps
(definitions in breakdown.sql).
"""

from __future__ import annotations

import duckdb

from bprof.analyzers.base import Finding, Options, Result, run_sql, severity_for, table_exists
from bprof.analyzers.classes import load_classes
from bprof.analyzers.waits import split_waits
from bprof.whatif.run import saved_ns

NAME = "breakdown"
TABLES = ["breakdown_steps", "breakdown_ranks", "breakdown_groups", "breakdown_dims", "breakdown_idle_gaps"]


# Communication kernels outside c10d (no process group names them) whose kind says which parallel
# dimension they serve: DeepEP's dispatch/combine move tokens between experts; TransformerEngine's
# userbuffers overlap tensor-parallel GEMMs with their communication. Others (torch symmetric memory,
# NVSHMEM, vLLM's all-reduce, peer copies) serve whichever group the program gave them: unknown.
KERNEL_DIMS = {"comm_deep_ep": "ep", "comm_dpsk_ep": "ep", "comm_te_userbuffers": "tp"}


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    load_classes(con, run_id)
    con.execute("CREATE OR REPLACE TEMP TABLE _bd_kernel_dims (rule_id VARCHAR, dim VARCHAR)")
    con.executemany("INSERT INTO _bd_kernel_dims VALUES (?, ?)", sorted(KERNEL_DIMS.items()))
    run_sql(con, "intervals.sql", run_id)
    run_sql(con, "breakdown.sql", run_id)
    if _has_rows(con, "collperf_waits", run_id):
        split_waits(con, run_id)
    return Result(NAME, TABLES, _findings(con, run_id))


def _has_rows(con: duckdb.DuckDBPyConnection, table: str, run_id: int) -> bool:
    # the table name is one of this module's constants, never user input
    return table_exists(con, table) and con.execute(f"SELECT count(*) > 0 FROM {table} WHERE run_id = ?", [run_id]).fetchone()[0]


def _findings(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    findings = []
    # Exposed communication per dimension: hiding it under compute shortens the step by at most its
    # exposed time - less the time spent waiting for the last peer to arrive, which no overlap
    # removes (that is the straggler's cost, priced by the stragglers analyzer). Once cross-rank
    # analysis split the step's exposed time (breakdown_steps.exposed_transfer_ns), a dimension's
    # recoverable time per step is bounded by the step's exposed transfer too (exact with one
    # dimension communicating); the worst rank's median step bounds what the job gets back.
    rows = con.execute("""
        WITH d AS (
            SELECT d.dim, d.rank, d.step, d.exposed_comm_ns, d.comm_ns,
                least(d.exposed_comm_ns, coalesce(s.exposed_transfer_ns, d.exposed_comm_ns)) AS recoverable_ns,
                s.exposed_transfer_ns IS NOT NULL AS split
            FROM breakdown_dims d
            LEFT JOIN breakdown_steps s ON s.run_id = d.run_id AND s.rank = d.rank AND s.step = d.step
            WHERE d.run_id = ?
        )
        SELECT dim, rank, median(recoverable_ns) AS recoverable_ns, median(exposed_comm_ns) AS exposed_ns,
            median(comm_ns) AS comm_ns, list(step ORDER BY step), bool_and(split)
        FROM d GROUP BY dim, rank
        QUALIFY row_number() OVER (PARTITION BY dim ORDER BY median(recoverable_ns) DESC, rank) = 1
        ORDER BY recoverable_ns DESC""", [run_id]).fetchall()
    step_ns = _median_step_ns(con, run_id)
    # the one engine's answer per dimension (free-comm:DIM); without a step graph the measured bound stands
    dims = [d for d in dict.fromkeys(dim for dim, _, recoverable_ns, *_ in rows if recoverable_ns and step_ns)
            if d and d != "unknown"]
    found, _ = saved_ns(con, run_id, [f"free-comm:{d}" for d in dims])
    priced = {d: found[f"free-comm:{d}"] for d in dims if f"free-comm:{d}" in found}
    for dim, rank, recoverable_ns, exposed_ns, comm_ns, steps, split in rows:
        if not recoverable_ns or not step_ns:
            continue
        recoverable_ns, exposed_ns = int(recoverable_ns), int(exposed_ns)
        measured_ns = recoverable_ns
        waiting = (f"Of its {exposed_ns / 1e6:.2f} ms exposed, {(exposed_ns - recoverable_ns) / 1e6:.2f} ms was waiting "
                   f"for the last peer to arrive, which no overlap removes (see the straggler findings)."
                   if split else
                   "Exposed time includes waiting for the slowest peer: cross-rank analysis (match, clock, collperf) "
                   "separates it.")
        title = f"Exposed {dim.upper()} communication: {recoverable_ns / 1e6:.2f} ms per step on rank {rank}"
        counterfactual = (f"Counterfactual: this dimension's calls fully hidden under compute (or free); the step "
                          f"would be shorter by at most {recoverable_ns / 1e6:.2f} ms of the {comm_ns / 1e6:.2f} ms "
                          f"in flight (median over steps, worst rank).")
        if dim in priced:
            # the one engine's answer: the dimension's transfers free on every rank, the job's step
            recoverable_ns = max(min(priced[dim], measured_ns), 0)
            counterfactual = (f"Counterfactual (bprof whatif -s free-comm:{dim}): this dimension's transfers free on "
                              f"every rank, the job's step would be {recoverable_ns / 1e6:.2f} ms shorter (median over "
                              f"steps); measured: {measured_ns / 1e6:.2f} ms exposed beyond waiting on rank {rank}, of "
                              f"{comm_ns / 1e6:.2f} ms in flight.")
            if recoverable_ns < measured_ns:
                title += f"; hiding it buys {recoverable_ns / 1e6:.2f} ms"
        findings.append(Finding(
            severity_for(recoverable_ns, step_ns) if recoverable_ns > 0 else "info", title,
            _DIM_ADVICE.get(dim, "Overlap this communication with compute, or make it smaller."),
            f"{counterfactual} {waiting}",
            recoverable_ns, {"ranks": [rank], "steps": steps, "dim": dim, "exposed_recoverable_ns": measured_ns}))
    return findings


def _median_step_ns(con: duckdb.DuckDBPyConnection, run_id: int) -> float | None:
    return con.execute("SELECT median(span_ns) FROM breakdown_steps WHERE run_id = ?", [run_id]).fetchone()[0]


_DIM_ADVICE = {
    "tp": "Overlap tensor-parallel collectives with compute (sequence parallelism, async TP / collective matmul), or keep TP within one NVLink domain.",
    "dp": "Overlap gradient all-reduce with the backward (DDP buckets, bucket_cap_mb), or shard with FSDP/ZeRO and prefetch.",
    "fsdp": "Prefetch the next all-gather (forward/backward prefetch), raise the FSDP unit size, or reshard less often.",
    "pp": "Use more micro-batches or an interleaved schedule so pipeline sends/recvs hide behind compute.",
    "cp": "Overlap the context-parallel ring exchange with attention compute.",
    "ep": "Overlap expert all-to-all with compute and balance the experts' token load.",
    "world": "Overlap these whole-job collectives with compute, or issue them less often.",
    "embedding": "The tied-embedding gradient all-reduce between the first and last pipeline stages: untie the "
                 "embeddings, or overlap it with the last backward chunk.",
}
