"""How fast does the host feed the device? Kernel counts, launch latency, tiny kernels and the idle
gaps between them, CUDA graphs (definitions in launch.sql); a finding for a tiny-kernel storm.

Reads timeline_spans, breakdown_idle_gaps, events; writes launch_steps, launch_tiny_kernels.
"""

from __future__ import annotations

import statistics

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql, severity_for
from bprof.kernels.classify import is_graph_launch

NAME = "launch"
TABLES = ["launch_steps", "launch_tiny_kernels"]
TINY_NS = 10_000  # a kernel shorter than this costs about as much to launch as to run
# A storm: at least STORM_MIN_TINY tiny kernels per step (fewer are not worth capturing), at least
# STORM_KERNEL_FRAC of the step's kernels, and idle between them of at least STORM_GAP_FRAC of the
# step (what severity_for calls a warning).
STORM_MIN_TINY = 100
STORM_KERNEL_FRAC = 0.5
STORM_GAP_FRAC = 0.02


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    result = Result(NAME, TABLES)
    names = [n for (n,) in con.execute(
        "SELECT DISTINCT name FROM events WHERE run_id = ? AND kind IN ('cuda_runtime', 'cuda_driver') AND name IS NOT NULL",
        [run_id]).fetchall()]
    run_sql(con, "launch.sql", run_id, {"tiny_ns": TINY_NS, "top_n": options.top_n,
                                        "graph_launch_names": [n for n in names if is_graph_launch(n)]})
    if not con.execute("SELECT count(*) FROM launch_steps WHERE run_id = ?", [run_id]).fetchone()[0]:
        # CPU runs: the training thread runs its ops itself; there is no launch to measure.
        result.findings.append(not_measurable(
            "Kernel launches: not measurable on a CPU run",
            "No rank has device activity (kernels, memcpy, memset): CPU ops run on the calling thread, "
            "so there is no launch latency, no tiny-kernel gap and no CUDA graph to count.",
            "Record a GPU run to measure launch overhead; on CPU, the idle analyzer's Python-between-ops "
            "finding is the analogue."))
        return result
    finding = _storm(con, run_id)
    if finding:
        result.findings.append(finding)
    return result


def _storm(con: duckdb.DuckDBPyConnection, run_id: int) -> Finding | None:
    """lost_ns = the median per-step idle time between tiny kernels on the rank where it is largest.
    Counterfactual: each run of tiny kernels replayed as one CUDA graph (or fused by torch.compile),
    so the device goes from one to the next without waiting for the host: their gaps vanish, their
    own run time stays."""
    rows = con.execute("""
        SELECT l.rank, l.step, l.num_kernels, l.num_tiny_kernels, l.tiny_gap_ns, l.num_tiny_gaps, s.dur_ns,
            l.median_launch_latency_ns
        FROM launch_steps l JOIN timeline_spans s USING (run_id, rank, step)
        WHERE l.run_id = ? ORDER BY l.rank, l.step""", [run_id]).fetchall()
    by_rank: dict[int, list[tuple]] = {}
    for row in rows:
        by_rank.setdefault(row[0], []).append(row)
    if not by_rank:
        return None
    gap = {r: statistics.median(x[4] for x in rs) for r, rs in by_rank.items()}
    worst = max(gap, key=lambda r: (gap[r], -r))
    rs = by_rank[worst]
    lost_ns = int(gap[worst])
    step_ns = statistics.median(x[6] for x in rs)
    kernels, tiny = sum(x[2] for x in rs), sum(x[3] for x in rs)
    if (not kernels or tiny / len(rs) < STORM_MIN_TINY or tiny / kernels < STORM_KERNEL_FRAC
            or lost_ns < STORM_GAP_FRAC * step_ns):
        return None
    names = [n for (n,) in con.execute(
        "SELECT name FROM launch_tiny_kernels WHERE run_id = ? AND rank = ? ORDER BY num_kernels DESC, name LIMIT 3",
        [run_id, worst]).fetchall()]
    latency = statistics.median([x[7] for x in rs if x[7] is not None] or [0])
    return Finding(
        severity_for(lost_ns, step_ns),
        f"Tiny-kernel storm: {tiny / len(rs):.0f} kernels under {TINY_NS // 1000} µs per step on rank {worst}, "
        f"{lost_ns / 1e6:.2f} ms of idle between them",
        "Replay the step (or its hot loops) as CUDA graphs (torch.compile mode='reduce-overhead', "
        "torch.cuda.graphs), fuse elementwise chains with torch.compile, use fused/foreach optimizers.",
        f"Counterfactual: the runs of tiny kernels replayed as CUDA graphs or fused, so the device does not wait "
        f"for the host between them; the step would be shorter by their idle gaps ({lost_ns / 1e6:.2f} ms, median "
        f"over steps on rank {worst}), their own run time stays. {tiny} of {kernels} kernels are under "
        f"{TINY_NS // 1000} µs; median launch latency {latency / 1e3:.1f} µs. Most frequent: {', '.join(names)}.",
        lost_ns,
        {"ranks": [worst], "steps": [x[1] for x in rs], "tiny_kernels": names,
         "tiny_gap_ns_by_rank": {str(r): int(gap[r]) for r in sorted(gap)}})
