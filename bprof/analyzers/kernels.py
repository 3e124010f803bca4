"""What does the device spend its time on, and how many FLOPs did each step execute?

Kernel time by catalogue class and top kernels; FLOPs and bytes of matmul-class ops from recorded
shapes (bprof.kernels.costs) with their coverage of matmul time; matmul time by dtype, with fp32
matmuls flagged when a faster precision exists on the device; unknown kernel names counted.
Reads events, timeline_spans; writes kernels_classes, kernels_top, kernels_ops, kernels_flops.
"""

from __future__ import annotations

import json

import duckdb
import pandas as pd

from bprof.analyzers.base import Finding, Options, Result, run_sql, severity_for
from bprof.analyzers.classes import load_classes
from bprof.analyzers.peaks import rank_peaks
from bprof.kernels.classify import classify
from bprof.kernels.costs import FLOP_LEAF_OPS, MATMUL_CLASS_OPS, op_cost

NAME = "kernels"
TABLES = ["kernels_classes", "kernels_top", "kernels_ops", "kernels_flops", "kernels_roofline"]


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    load_classes(con, run_id)
    matmul_ops = sorted(MATMUL_CLASS_OPS | FLOP_LEAF_OPS)
    _load_costs(con, run_id, matmul_ops)
    run_sql(con, "kernels.sql", run_id, {"matmul_ops": matmul_ops, "top_n": options.top_n})
    _roofline(con, run_id, options)
    result = Result(NAME, TABLES)
    result.findings += _unknown_finding(con, run_id)
    result.findings += _precision_findings(con, run_id, options)
    return result


def _load_costs(con: duckdb.DuckDBPyConnection, run_id: int, matmul_ops: list[str]) -> None:
    """One cost per distinct (op, shapes, types, concrete inputs): shapes repeat, so this is small."""
    sigs = con.execute("""
        SELECT DISTINCT name, CAST(args -> '$."Input Dims"' AS VARCHAR), CAST(args -> '$."Input type"' AS VARCHAR),
               CAST(args -> '$."Concrete Inputs"' AS VARCHAR)
        FROM events WHERE run_id = ? AND kind = 'cpu_op' AND name IN (SELECT unnest(?))""",
                       [run_id, matmul_ops]).fetchall()
    rows = []
    for name, dims, types, concrete in sigs:
        cost = op_cost(name, _load(dims), _load(types), _load(concrete)) if dims else None
        fine = classify(name, "cpu_op").fine_class
        rows.append((name, dims, types, concrete, None if cost is None else float(cost.flops),
                     None if cost is None else float(cost.bytes), None if cost is None else cost.dtype,
                     fine if fine in ("gemm", "attention") else "gemm", name in FLOP_LEAF_OPS))
    frame = pd.DataFrame(rows, columns=["name", "dims", "types", "concrete", "flops", "bytes", "dtype", "fine_class", "leaf"])
    frame = frame.astype({"flops": "float64", "bytes": "float64", "dtype": "object", "leaf": "bool"})
    con.register("_kn_costs_frame", frame)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _kn_costs AS SELECT * FROM _kn_costs_frame")
    finally:
        con.unregister("_kn_costs_frame")


def _roofline(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> None:
    """Where the top shapes sit against the roofline of their device (the first rank's peaks)."""
    rows = con.execute("""
        SELECT name, input_dims, dtype, sum(num_calls), sum(flops), sum(bytes), sum(dur_ns), min(rank)
        FROM kernels_ops WHERE run_id = ? AND flops IS NOT NULL AND dur_ns > 0
        GROUP BY name, input_dims, dtype ORDER BY sum(dur_ns) DESC LIMIT ?""", [run_id, options.top_n]).fetchall()
    peaks_by_dtype: dict = {}
    out = []
    for name, dims, dtype, calls, flops, nbytes, dur_ns, rank in rows:
        if dtype not in peaks_by_dtype:
            peaks_by_dtype[dtype] = rank_peaks(con, run_id, options, dtype)
        peak = peaks_by_dtype[dtype].get(rank)
        flops_s = flops / (dur_ns * 1e-9)
        bytes_s = nbytes / (dur_ns * 1e-9) if nbytes else None
        intensity = flops / nbytes if nbytes else None
        pf = peak.flops_per_s if peak else None
        pb = peak.mem_bytes_per_s if peak else None
        bound = ("compute" if intensity >= pf / pb else "memory") if pf and pb and intensity else None
        roof = min(pf, intensity * pb) if pf and pb and intensity else pf
        out.append((run_id, name, dims, dtype, calls, flops, nbytes, dur_ns, flops_s, bytes_s, intensity, pf, pb, bound,
                    flops_s / roof if roof else None))
    if out:
        con.executemany("INSERT INTO kernels_roofline VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", out)


def _load(text):
    return json.loads(text) if text else None


def _unknown_finding(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Finding]:
    total, unknown, names = con.execute("""
        SELECT sum(dur_ns), sum(dur_ns) FILTER (WHERE fine_class = 'unknown'),
               list(DISTINCT name) FILTER (WHERE fine_class = 'unknown')
        FROM _kn_rows""").fetchone()
    if not unknown:
        return []
    names = sorted(names)[:20]
    return [Finding(
        "info", f"{unknown / total:.1%} of kernel time is in kernels bprof cannot classify ({len(names)} names)",
        "Nothing to fix in training: the names are listed so the catalogue can learn them (on GPU traces they count as compute, as HTA does).",
        "Not a cost: no lost time is claimed.", None, {"names": names})]


def _precision_findings(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> list[Finding]:
    """fp32 matmuls where the device has a faster dense precision; the gain is priced by the peak ratio."""
    rows = con.execute("""
        SELECT rank, median(fp32_ns) AS fp32_ns, list(step ORDER BY step) AS steps FROM (
            SELECT rank, step, sum(dur_ns) FILTER (WHERE dtype = 'fp32') AS fp32_ns
            FROM kernels_ops WHERE run_id = ? AND step >= 0 GROUP BY rank, step)
        WHERE fp32_ns > 0 GROUP BY rank ORDER BY fp32_ns DESC""", [run_id]).fetchall()
    if not rows:
        return []
    rank, fp32_ns, steps = rows[0]
    fp32 = rank_peaks(con, run_id, options, "fp32").get(rank)
    best, known = None, {}
    for dtype in ("tf32", "bf16"):
        lower = rank_peaks(con, run_id, options, dtype).get(rank)
        if lower and lower.flops_per_s:
            known[dtype] = lower.flops_per_s
        if fp32 and lower and fp32.flops_per_s and lower.flops_per_s and lower.flops_per_s > fp32.flops_per_s:
            if best is None or lower.flops_per_s > best[1].flops_per_s:
                best = (dtype, lower)
    step_ns = con.execute("SELECT median(span_ns) FROM breakdown_steps WHERE run_id = ? AND rank = ?",
                          [run_id, rank]).fetchone()[0] or 0
    if best is None:
        title = f"fp32 matmuls take {fp32_ns / 1e6:.2f} ms per step on rank {rank}"
        evidence = {"ranks": [rank], "steps": steps}
        if fp32 and fp32.flops_per_s and known:
            # a comparison only where both sides have a peak (measured or datasheet)
            peaks = ", ".join(f"{d} {v / 1e9:,.1f}" for d, v in known.items())
            return [Finding("info", title,
                            f"Keep fp32 here: the lower precisions' peaks are no higher on this device ({peaks} vs fp32 "
                            f"{fp32.flops_per_s / 1e9:,.1f} GFLOP/s).",
                            "No gain claimed: no lower precision has a higher measured or datasheet peak on this device.",
                            None, {**evidence, "fp32_flops_per_s": fp32.flops_per_s,
                                   **{f"{d}_flops_per_s": v for d, v in known.items()}})]
        why = ("no lower precision has a measured or datasheet peak on this device, so none was compared"
               if fp32 and fp32.flops_per_s else f"the fp32 peak is unknown ({fp32.source if fp32 else 'no rank'})")
        return [Finding("info", title,
                        "Not measured whether bf16 would be faster here: measure it with `bprof calibrate --dtype bf16`, "
                        "or time these matmuls with `bprof replay --variant bf16`.",
                        f"No gain claimed: {why}.", None, evidence)]
    dtype, lower = best
    lost_ns = int(fp32_ns * (1 - fp32.flops_per_s / lower.flops_per_s))
    return [Finding(
        severity_for(lost_ns, step_ns), f"fp32 matmuls: {fp32_ns / 1e6:.2f} ms per step on rank {rank} could run in {dtype}",
        f"Run matmuls in {dtype} (autocast / torch.set_float32_matmul_precision('high')) and verify accuracy.",
        f"Counterfactual: those matmuls at the {dtype} peak instead of the fp32 one "
        f"({lower.flops_per_s / 1e12:.1f} vs {fp32.flops_per_s / 1e12:.1f} TFLOP/s), at the same share of peak; "
        f"assumes they stay compute-bound.",
        lost_ns, {"ranks": [rank], "steps": steps, "dtype": dtype})]
