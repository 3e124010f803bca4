"""The numbers CI gates on: step time, MFU, HFU and tokens/s, per rank and step and per run.

Definitions (the README repeats them):
- step time of the job = for each step, the longest span over ranks (the job moves at its slowest
  rank); the run's `step_time_ns` is the median over steps. A rank's span is its step on the device
  where it has one (the device work the step launched: when the host runs ahead, the CPU ranges
  understate the step), else its CPU step (timeline_spans); MFU, HFU and tokens/s divide by it.
- MFU = declared model FLOPs per step / (step time × Σ over the job's ranks of the dense peak at
  the matmul dtype). Model FLOPs come from the capture (bprof.set_model_flops) - never from traces.
- HFU = executed FLOPs per step from recorded shapes (recompute included; kernels_flops) summed
  over the ingested ranks, mean over the steps where every rank's are known / (step time × Σ of
  their peaks): MFU's denominator, so HFU / MFU = executed / declared FLOPs whatever the step times
  did. Needs FLOP coverage ≥ 90% of matmul time.
- Peaks come from bprof.analyzers.peaks: never guessed; unknown gives "not measurable" and the fix.
Reads timeline_spans, kernels_flops, runs, ranks, reduced_ranks; writes metrics and step_metrics.
"""

from __future__ import annotations

import json
import statistics

import duckdb

from bprof.analyzers.base import Finding, Options, Result, not_measurable, table_exists, write_metrics
from bprof.analyzers.peaks import rank_peaks
from bprof.kernels.devices import normalize_dtype

NAME = "metrics"
TABLES: list[str] = []  # writes the store's metrics and step_metrics (replaced below)
MIN_FLOP_COVERAGE_FRAC = 0.9


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    result = Result(NAME, ["metrics", "step_metrics"])
    con.execute("DELETE FROM step_metrics WHERE run_id = ?", [run_id])
    con.execute("DELETE FROM metrics WHERE run_id = ? AND computed_by = ?", [run_id, NAME])
    spans = con.execute("SELECT rank, step, dur_ns FROM timeline_spans WHERE run_id = ? AND dur_ns > 0 ORDER BY step, rank",
                        [run_id]).fetchall()
    if not spans:
        result.findings.append(not_measurable("No step spans: nothing to measure", "The run has no events to span.",
                                              "Ingest a run with traced steps."))
        return result
    world_size, num_ranks, metadata = con.execute(
        "SELECT world_size, num_ranks_ingested, metadata FROM runs WHERE run_id = ?", [run_id]).fetchone()
    world_size = world_size or num_ranks
    model = (json.loads(metadata) if metadata else {}).get("bprof_model") or {}
    model_flops = model.get("model_flops_per_step")
    tokens = options.tokens_per_step or model.get("tokens_per_step")

    flops, coverage = {}, None
    if table_exists(con, "kernels_flops"):
        flops = {(r, s): (f, cov, dt) for r, s, f, cov, dt in con.execute(
            "SELECT rank, step, executed_flops, flop_coverage_frac, matmul_dtype FROM kernels_flops WHERE run_id = ?",
            [run_id]).fetchall()}
        # time-weighted over every rank and step: the share of all matmul-class time with known FLOPs
        coverage = con.execute("SELECT sum(matmul_known_ns) / nullif(sum(matmul_ns), 0) FROM kernels_flops WHERE run_id = ?",
                               [run_id]).fetchone()[0]
    dtypes = [dt for (_, _, dt) in flops.values() if dt]
    dtype = normalize_dtype(statistics.mode(dtypes)) if dtypes else None
    # fp8 runs divide by the bf16 dense peak, the usual denominator; the fp8 figure is stated beside it
    denominator_dtype = "bf16" if dtype == "fp8" else dtype
    peaks = rank_peaks(con, run_id, options, denominator_dtype)
    known_peaks = [p.flops_per_s for p in peaks.values() if p.flops_per_s]
    peak_missing = [r for r, p in peaks.items() if not p.flops_per_s]

    by_step: dict[int, list[tuple[int, int]]] = {}
    for rank, step, dur_ns in spans:
        by_step.setdefault(step, []).append((rank, dur_ns))
    job_step_ns = {step: max(d for _, d in rows) for step, rows in by_step.items()}
    step_time_ns = statistics.median(job_step_ns.values())

    samples = []
    for rank, step, dur_ns in spans:
        samples.append((rank, step, "step_time_ns", dur_ns, "ns"))
        peak = peaks.get(rank)
        if peak and peak.flops_per_s:
            if model_flops:
                samples.append((rank, step, "mfu_frac", model_flops / world_size / (dur_ns * 1e-9 * peak.flops_per_s), "frac"))
            f, cov, _ = flops.get((rank, step), (None, None, None))
            if f and cov is not None and cov >= MIN_FLOP_COVERAGE_FRAC:
                samples.append((rank, step, "hfu_frac", f / (dur_ns * 1e-9 * peak.flops_per_s), "frac"))
        if tokens:
            samples.append((rank, step, "tokens_per_s_per_device", tokens / world_size / (dur_ns * 1e-9), "tokens_per_s"))
    if samples:
        con.executemany("INSERT INTO step_metrics VALUES (?, ?, ?, ?, ?, ?)", [(run_id, *s) for s in samples])

    metrics: dict[str, tuple[float | None, str]] = {
        "step_time_ns": (float(step_time_ns), "ns"),
        "step_time_max_ns": (float(max(job_step_ns.values())), "ns"),
        "num_steps": (float(len(job_step_ns)), "count"),
    }
    peak_sum = statistics.mean(known_peaks) * world_size if known_peaks and not peak_missing else None
    metrics["peak_flops_per_s_per_device"] = (statistics.mean(known_peaks) if known_peaks and not peak_missing else None, "flops_per_s")
    if peak_missing:
        why = peaks[peak_missing[0]].source
        result.findings.append(not_measurable(
            "MFU and HFU are not measurable: the device peak is unknown",
            f"No dense peak for rank(s) {peak_missing[:8]}: {why}.",
            "Run `bprof calibrate` on the host (CPU) or give --peak-tflops; bprof never guesses a peak.",
            ranks=peak_missing[:64]))
    if not model_flops:
        result.findings.append(not_measurable(
            "MFU is not measurable: the run declared no model FLOPs",
            "MFU counts the model's declared FLOPs, never traced ones; this run did not record any.",
            "Call bprof.set_model_flops(flops_per_step) in the training script (under bprof record).",
        ))
    metrics["mfu_frac"] = (model_flops / (step_time_ns * 1e-9 * peak_sum) if model_flops and peak_sum else None, "frac")
    if peak_sum:
        result.findings.append(_denominator_note(con, run_id, options, peaks, dtype, denominator_dtype))

    hfu = _hfu(flops, job_step_ns, step_time_ns, peaks)
    metrics["flop_coverage_frac"] = (coverage, "frac")
    metrics["hfu_frac"] = (hfu if peak_sum and coverage is not None and coverage >= MIN_FLOP_COVERAGE_FRAC else None, "frac")
    if coverage is None and con.execute("SELECT count(*) FROM reduced_ranks WHERE run_id = ?", [run_id]).fetchone()[0]:
        result.findings.append(not_measurable(
            "HFU is not measurable: the run's ranks were ingested from bprof reduce outputs",
            "HFU counts executed FLOPs from the recorded shapes of ops, which are events; reduced ranks carry none.",
            "Ingest the ranks' traces instead of their rank<R>.reduced outputs.", coverage_frac=None))
    elif coverage is None or coverage < MIN_FLOP_COVERAGE_FRAC:
        result.findings.append(not_measurable(
            "HFU is not measurable: too little matmul time has known FLOPs",
            f"FLOP coverage is {'unknown (no matmul-class work found)' if coverage is None else f'{coverage:.0%}'}; "
            f"HFU needs {MIN_FLOP_COVERAGE_FRAC:.0%} of matmul-class time to come from ops with recorded shapes.",
            "Record with shapes (bprof record does; torch.profiler(record_shapes=True)); kernels launched by CUDA "
            "graphs or unmodelled ops carry no shapes.", coverage_frac=coverage))
    result.findings += _bounded(metrics)
    if tokens:
        metrics["tokens_per_s_per_device"] = (tokens / world_size / (step_time_ns * 1e-9), "tokens_per_s")
        metrics["tokens_per_s"] = (tokens / (step_time_ns * 1e-9), "tokens_per_s")
    metrics["model_flops_per_step"] = (float(model_flops) if model_flops else None, "flops")
    write_metrics(con, run_id, NAME, metrics)
    return result


def _denominator_note(con, run_id: int, options: Options, peaks: dict, dtype: str | None, used: str | None) -> Finding:
    first = peaks[min(peaks)]
    detail = f"Peak per device: {first.flops_per_s / 1e12:.4g} TFLOP/s, {first.source}."
    if dtype == "fp8":
        fp8 = rank_peaks(con, run_id, options, "fp8")[min(peaks)]
        if fp8.flops_per_s:
            detail += (f" The matmuls ran in fp8: against the fp8 dense peak ({fp8.flops_per_s / 1e12:.4g} TFLOP/s) "
                       f"MFU and HFU would be {first.flops_per_s / fp8.flops_per_s:.2f}x the reported values.")
    elif dtype is None:
        detail += " The matmul dtype is unknown (no recorded shapes), so the usual denominator is used."
    return Finding("info", f"MFU and HFU divide by the dense {used or 'default'} peak", "Nothing to fix: the denominator, stated.",
                   detail, None, {"dtype": dtype, "denominator_dtype": used, "peak_flops_per_s": first.flops_per_s})


def _hfu(flops: dict, job_step_ns: dict, step_time_ns: float, peaks: dict) -> float | None:
    """Run HFU over the steps with every rank's FLOPs and peak known: their executed FLOPs per step
    (mean over those steps) / (the run's step time × Σ of the ranks' peaks) - MFU's denominator, so
    HFU / MFU is executed over declared FLOPs whatever the step times did."""
    per_step, capacity = [], None
    for step in job_step_ns:
        rows = [(r, f) for (r, s), (f, c, _) in flops.items() if s == step]
        if not rows or any(f is None for _, f in rows) or any(not (peaks.get(r) and peaks[r].flops_per_s) for r, _ in rows):
            continue
        per_step.append(sum(f for _, f in rows))
        capacity = sum(peaks[r].flops_per_s for r, _ in rows)
    if not per_step or not capacity or not step_time_ns:
        return None
    return statistics.mean(per_step) / (step_time_ns * 1e-9 * capacity)


# Executed over declared FLOPs: full activation recompute runs one more forward (4/3 of forward +
# backward); beyond this, or below 1 less the rounding of FLOP formulas, the declared model FLOPs
# (or the formula behind them) disagree with the work the ranks ran.
MAX_RECOMPUTE_RATIO = 1.4
MIN_DECLARED_RATIO = 0.9


def _bounded(metrics: dict) -> list[Finding]:
    """Physical invariants of MFU and HFU, enforced on `metrics` in place: a utilisation above 100%
    is withheld (None) with a not_measurable finding saying which input must be wrong; declared model
    FLOPs that the executed FLOPs (counted from shapes) contradict by more than recompute can explain
    get a warning with the ratio."""
    out = []
    for name, label in (("mfu_frac", "MFU"), ("hfu_frac", "HFU")):
        value = metrics.get(name, (None, "frac"))[0]
        if value is not None and value > 1.0:
            metrics[name] = (None, "frac")
            what = ("the declared model FLOPs (bprof.set_model_flops) or the device peak" if name == "mfu_frac"
                    else "the device peak or the FLOPs counted from shapes")
            out.append(not_measurable(
                f"{label} is not measurable: it computes to {value:.1%}, above 100%",
                f"{label} = FLOPs per step / (step time x the devices' dense peak) came to {value:.1%}; no device runs "
                f"above its peak, so {what} is wrong.",
                "Check the peak (bprof calibrate, --peak-tflops) and the model FLOPs formula (6 x parameters x tokens "
                "for a dense transformer's forward and backward, plus attention).", computed_frac=value))
    mfu, hfu = metrics.get("mfu_frac", (None,))[0], metrics.get("hfu_frac", (None,))[0]
    if mfu and hfu:
        ratio = hfu / mfu
        if ratio > MAX_RECOMPUTE_RATIO or ratio < MIN_DECLARED_RATIO:
            out.append(Finding(
                "warning", f"Declared model FLOPs disagree with the executed FLOPs: executed / declared = {ratio:.2f}",
                "Check the model FLOPs formula given to bprof.set_model_flops (a wrong formula is the commonest MFU "
                "bug in public trainers): per token, 6 x parameters for forward and backward, plus attention's "
                "12 x layers x sequence x hidden.",
                f"The ranks executed {ratio:.2f}x the declared model FLOPs per step (HFU {hfu:.2%} against MFU "
                f"{mfu:.2%}, both on the same step time and peak). Recompute can explain up to "
                f"{MAX_RECOMPUTE_RATIO}x, and executed FLOPs below {MIN_DECLARED_RATIO}x of the declared ones mean the "
                "declared number counts work that never ran.", None,
                {"executed_over_declared": ratio, "mfu_frac": mfu, "hfu_frac": hfu}))
    return out
