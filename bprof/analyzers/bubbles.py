"""Pipeline bubbles: the stages and micro-batches of a pipeline-parallel run (from its send/recv
calls, cross-checked with what the training script declared), how long each stage waits for its
neighbours per step against the schedule's theory, and which stage's extra work causes the excess.

Schedules: 1F1B and GPipe (a chain of stages; theory (p-1)/(m+p-1)) and interleaved 1F1B (v model
chunks per stage; theory (p-1)/(v*m+p-1)): with p >= 3 its send/recv calls form a ring (the last
stage sends to the first for the next chunk), and m and v come from the calls; with p = 2 the ring is
one link both ways, and the declared chunks and micro-batches are used when the calls fit them.

Reads collectives, timeline_spans, breakdown_steps, breakdown_dims, breakdown_groups, runs; writes
bubbles_stages, bubbles_runs (definitions in bubbles.sql). A run without send/recv calls has no
pipeline and gets nothing: no rows, no finding.
"""

from __future__ import annotations

import json
import math

import duckdb
import numpy as np

from bprof.analyzers.base import Finding, Options, Result, not_measurable, run_sql, severity_for
from bprof.whatif.pipeline import flow_shop_ns, interleaved_step_ns
from bprof.whatif.run import saved_ns

NAME = "bubbles"
TABLES = ["bubbles_stages", "bubbles_runs"]
# A cost under this share of the step is not reported: below what severity_for calls a warning, and
# step times on shared machines move by about that much from run to run.
MIN_LOST_FRAC = 0.02
# Noise is judged on ratios, not on times: the load of a shared machine stretches every stage of a
# step alike, so step times can vary by half while the stages' ratios and bubble shares hold.
NOISE_MADS = 3
SCALE = 8  # busy medians (of medians) are multiples of 1/8 ns: x 8 replays them exactly in integer ns


def analyze(con: duckdb.DuckDBPyConnection, run_id: int, options: Options) -> Result:
    run_sql(con, "bubbles.sql", run_id)
    result = Result(NAME, TABLES)
    cur = con.execute("SELECT * FROM bubbles_runs WHERE run_id = ?", [run_id])
    names = [d[0] for d in cur.description]
    row = cur.fetchone()
    if row is None:
        missing = _missing_pipeline(con, run_id)
        if missing:
            result.findings.append(missing)
        return result
    run = dict(zip(names, row))
    run["imbalance_lost_ns"], run["imbalance_priced_by"] = _imbalance_price(con, run_id, run)
    con.execute("UPDATE bubbles_runs SET imbalance_lost_ns = ? WHERE run_id = ?", [run["imbalance_lost_ns"], run_id])
    stages = _stages(con, run_id)
    imbalance = _imbalance_finding(run, stages)
    bubble = _bubble_finding(run, stages, imbalance)
    [metadata] = con.execute("SELECT metadata FROM runs WHERE run_id = ?", [run_id]).fetchone()
    chunks = ((json.loads(metadata) if metadata else {}).get("bprof_model") or {}).get("chunks")
    result.findings += [f for f in (bubble, imbalance, _declared_mismatch(run, chunks)) if f]
    return result


def _imbalance_price(con, run_id, run) -> tuple[int | None, str]:
    """What the slowest stage costs and how it was priced. With every send/recv matched across ranks:
    the step graph replayed with that stage's own work at the other stages' median (the what-if
    `balanced-stages`, so the finding and the scenario are one number). Otherwise (unmatched p2p
    cannot carry the stage's change to its neighbours, or the engine withheld its replay) the
    modelled schedule of _imbalance_lost_ns, with the reason."""
    if not con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'match_instances'").fetchone()[0]:
        return _imbalance_lost_ns(con, run_id, run), "the run's collectives are not matched across ranks"
    unmatched = con.execute("""SELECT count(*) FROM match_instances WHERE run_id = ? AND op = 'p2p'
                               AND status <> 'complete'""", [run_id]).fetchone()[0]
    if run["slowest_stage"] is not None and not unmatched:
        saved, why = saved_ns(con, run_id, ["balanced-stages"])
        if "balanced-stages" in saved:
            return max(int(saved["balanced-stages"]), 0), "graph"
    else:
        why = f"{unmatched} send/recv instances are not matched across ranks"
    return _imbalance_lost_ns(con, run_id, run), why


def _imbalance_lost_ns(con, run_id, run) -> int | None:
    """What the slowest stage costs, replayed with the what-if engine: m equal micro-batches through
    the stages, each taking its median busy time / m, against the same with the slowest stage at the
    median of the others (None without another stage or a micro-batch count). With v > 1 chunks per
    stage the replay is the interleaved 1F1B schedule, each chunk's forward taking busy / (3 v m) and
    its backward twice that (m divisible by p, as Megatron's schedule needs; else the flow shop).

    The replay runs on the stages' whole busy times (m x the step, integer ns after x SCALE: the
    medians are multiples of 1/8 ns) and divides at the end, so no rounding per micro-batch (the
    replayed step scales with the stage times)."""
    m, slowest, v = run["num_microbatches"], run["slowest_stage"], run["num_chunks"]
    busy = dict(con.execute("""
        WITH stage_step AS (SELECT stage, step, median(busy_ns) AS busy_ns FROM bubbles_stages WHERE run_id = ? GROUP BY stage, step)
        SELECT stage, median(busy_ns) FROM stage_step GROUP BY stage ORDER BY stage""", [run_id]).fetchall())
    others = [v for s, v in busy.items() if s != slowest]
    if not m or m < 1 or slowest not in busy or not others:
        return None
    scaled = {s: round(v * SCALE) for s, v in busy.items()}
    balanced = {**scaled, slowest: round(float(np.median(others)) * SCALE)}
    stages = sorted(busy)
    work, even = np.array([scaled[s] for s in stages]), np.array([balanced[s] for s in stages])
    if v > 1 and m % len(stages) == 0:
        diff = interleaved_step_ns(work, m, v) - interleaved_step_ns(even, m, v)
        return int(math.floor(diff / (SCALE * 3 * v * m) + 0.5))
    diff = flow_shop_ns(work, m) - flow_shop_ns(even, m)
    return int(math.floor(diff / (SCALE * m) + 0.5))


def _stages(con, run_id) -> dict[int, dict]:
    """Per stage: its ranks, steps, median busy_ns and bubble_frac (as bubbles_runs aggregates them)."""
    rows = con.execute("""
        WITH stage_step AS (
            SELECT stage, step, median(busy_ns) AS busy_ns, median(bubble_frac) AS bubble_frac
            FROM bubbles_stages WHERE run_id = ? GROUP BY stage, step
        )
        SELECT s.stage, (SELECT list(DISTINCT rank ORDER BY rank) FROM bubbles_stages b WHERE b.run_id = ? AND b.stage = s.stage),
            list(step ORDER BY step), median(busy_ns), median(bubble_frac)
        FROM stage_step s GROUP BY s.stage ORDER BY s.stage""", [run_id, run_id]).fetchall()
    return {s: {"ranks": ranks, "steps": steps, "busy_ns": int(busy), "bubble_frac": frac}
            for s, ranks, steps, busy, frac in rows}


def _shape(run) -> str:
    sched = {"1f1b": "1F1B", "gpipe": "GPipe"}.get(run["schedule"], "1F1B/GPipe")
    if run["num_chunks"] > 1:
        sched = f"interleaved 1F1B, v={run['num_chunks']} chunks per stage"
    return f"{sched}, p={run['num_stages']} stages, m={run['num_microbatches']} micro-batches"


def _theory_text(run) -> str:
    return "(p-1)/(v*m+p-1)" if run["num_chunks"] > 1 else "(p-1)/(m+p-1)"


def _replay_text(run) -> str:
    """How the imbalance replay prices a stage's work (see _imbalance_lost_ns)."""
    if run["num_chunks"] > 1:
        return ("the interleaved 1F1B schedule replayed chunk by chunk (each stage's v chunks of a micro-batch "
                "taking t / v, forward 1/3 and backward 2/3 of it; (v*m+p-1) x t / v for equal stages)")
    return "the step runs at the pace of its slowest stage, T = sum of t + (m-1) x max t"


def _price_text(run) -> str:
    """How lost_ns of the imbalance finding was computed (see _imbalance_price)."""
    if run["imbalance_priced_by"] == "graph":
        return (f"The what-if engine replays the measured step graph with stage {run['slowest_stage']}'s own work between "
                "collectives scaled to that median, waiting and transfers as measured (`bprof whatif -s balanced-stages`)")
    return (f"The step graph cannot price it ({run['imbalance_priced_by']}), so the what-if engine replays the "
            "pipeline's micro-batches through stages that take t each, t = a stage's busy time per micro-batch "
            f"(busy = step span - time waiting for neighbours): {_replay_text(run)}")


def _imbalance_finding(run, stages) -> Finding | None:
    """The slowest stage, when it costs more than the run's noise.

    Counterfactual: the slowest stage does the median work of the other stages. m equal micro-batches
    through stages that take t_s = busy_ns / m each, replayed by the what-if engine (a step of
    T = sum_s t_s + (m-1) max_s t_s, (m+p-1) t for equal stages; interleaved 1F1B with v chunks:
    the chunk-level schedule, (v*m+p-1) t / v for equal stages); lost_ns = T - T(slowest at the
    others' median) (_imbalance_lost_ns). Where every send/recv is matched, lost_ns is instead the
    balanced-stages what-if on the measured step graph (_imbalance_price).
    Reported only when the same stage is the slowest in every analysed step, its ratio's excess over 1
    is above NOISE_MADS x the ratio's MAD over steps, and lost_ns is at least MIN_LOST_FRAC of the step.
    """
    lost_ns, ratio, mad, step_ns = run["imbalance_lost_ns"], run["slowest_ratio"], run["slowest_ratio_mad"], run["median_step_ns"]
    if lost_ns is None or ratio is None or not run["slowest_every_step"]:
        return None
    if ratio - 1 <= NOISE_MADS * (mad or 0) or lost_ns < MIN_LOST_FRAC * step_ns:
        return None
    s = run["slowest_stage"]
    busy = {str(k): v["busy_ns"] for k, v in stages.items()}
    return Finding(
        severity_for(lost_ns, step_ns),
        f"Stage imbalance: pipeline stage {s} is {ratio:.2f}x the median of the other stages "
        f"({run['slowest_busy_ns'] / 1e6:.1f} ms of work per step vs {run['median_other_busy_ns'] / 1e6:.1f} ms)",
        f"Move work off stage {s}: give it fewer layers (count the embedding on the first stage and the LM "
        f"head and loss on the last), or split the model by measured stage time rather than by layer count.",
        f"Counterfactual: stage {s} does the median work of the other stages. {_price_text(run)}; the step would "
        f"be shorter by {lost_ns / 1e6:.2f} ms. Stage {s} is the slowest in every analysed step, and its ratio to the others "
        f"varies by {mad or 0:.3f} (MAD over steps). Busy ns per stage: {busy}.",
        lost_ns,
        {"ranks": stages[s]["ranks"], "steps": stages[s]["steps"], "stage": s, "ratio": ratio,
         "busy_ns_by_stage": busy, "num_microbatches": run["num_microbatches"], "num_chunks": run["num_chunks"]})


def _bubble_finding(run, stages, imbalance: Finding | None) -> Finding | None:
    """The bubble above the schedule's theory, when it is above the run's noise.

    Counterfactual: the same total work spread evenly over the stages, each waiting only the
    schedule's theoretical share of the step: step' = mean busy / (1 - theory), with mean busy =
    step x (1 - measured); lost_ns = step - step'. Reported only when every
    analysed step is above theory, the excess fraction is above NOISE_MADS x the MAD over steps of
    the bubble fraction, and lost_ns is at least MIN_LOST_FRAC of the step. With a stage imbalance
    finding the bubble is its symptom: an info finding without lost_ns (the imbalance is priced).
    """
    lost_ns, mad, step_ns = run["excess_lost_ns"], run["bubble_frac_mad"], run["median_step_ns"]
    if not lost_ns or not run["above_theory_every_step"]:
        return None
    if run["excess_frac"] <= NOISE_MADS * (mad or 0) or lost_ns < MIN_LOST_FRAC * step_ns:
        return None
    measured, theory = run["bubble_frac_measured"], run["bubble_frac_theory"]
    fracs = {str(k): round(v["bubble_frac"], 4) for k, v in stages.items()}
    if imbalance:
        cause = (f"Stage {imbalance.evidence['stage']} does {imbalance.evidence['ratio']:.2f}x the work of the "
                 f"others and the rest wait for it: see the stage imbalance finding.")
        advice = f"Balance the pipeline stages first (stage {imbalance.evidence['stage']} is the slow one)."
    else:
        cause = ("No stage is consistently slower: look at the transfer time of the sends/recvs, a slow "
                 "rank (stragglers) or host gaps on one stage.")
        advice = "Find what delays the stages' sends and receives (transfers, a straggler, host gaps)."
    counterfactual = (
        f"Counterfactual: the same total work spread evenly over the stages, each waiting only the schedule's "
        f"share {_theory_text(run)} of the step: step' = mean busy time / (1 - theory); the step would be shorter by "
        f"{lost_ns / 1e6:.2f} ms ({run['excess_frac']:.1%} of the step above theory).")
    if imbalance:
        # a symptom of the imbalance, which the engine prices; the modelled ideal also drops the
        # send/recv transfers, which no schedule removes, so its figure is shown, never ranked
        counterfactual = (f"Not priced on its own: the stage imbalance finding prices what balancing buys "
                          f"({imbalance.lost_ns / 1e6:.2f} ms), and the exposed PP communication is the rest. The "
                          f"schedule's ideal (the work spread evenly, each stage waiting only {_theory_text(run)}) "
                          f"would be {lost_ns / 1e6:.2f} ms shorter, transfers included.")
    return Finding(
        "info" if imbalance else severity_for(lost_ns, step_ns),
        f"Pipeline bubble above theory: {measured:.1%} of the step waiting for neighbour stages vs "
        f"{theory:.1%} for {_shape(run)}",
        advice + (" More micro-batches per step or more model chunks per stage also shrink the bubble."
                  if run["num_chunks"] > 1 else " More micro-batches per step or an interleaved schedule also shrink the bubble."),
        f"{counterfactual} Every analysed step is above theory; the bubble fraction varies by {mad or 0:.3f} "
        f"(MAD over steps). {cause} Bubble fraction per stage: {fracs}.",
        None if imbalance else lost_ns,
        {"ranks": sorted(r for v in stages.values() for r in v["ranks"]),
         "steps": sorted({s for v in stages.values() for s in v["steps"]}),
         "bubble_frac_measured": measured, "bubble_frac_theory": theory, "bubble_frac_by_stage": fracs,
         "num_stages": run["num_stages"], "num_microbatches": run["num_microbatches"], "num_chunks": run["num_chunks"],
         "schedule": run["schedule"]})


def _declared_mismatch(run, declared_chunks) -> Finding | None:
    """The training script declared a different pipeline than the send/recv calls show."""
    pairs = [("pp", run["declared_stages"], run["num_stages"], run["stages_source"]),
             ("microbatches", run["declared_microbatches"], run["num_microbatches"], run["microbatches_source"]),
             ("schedule", run["declared_schedule"], run["schedule"], run["schedule_source"]),
             ("chunks", declared_chunks if isinstance(declared_chunks, int) else None, run["num_chunks"], run["schedule_source"])]
    wrong = [(k, d, m) for k, d, m, src in pairs if d is not None and m is not None and src != "declared" and d != m]
    if not wrong:
        return None
    text = ", ".join(f"{k} declared {d}, measured {m}" for k, d, m in wrong)
    return Finding(
        "info", f"The declared pipeline differs from the trace: {text}",
        "Check the training script's bprof_model metadata; bubbles uses what the send/recv calls show.",
        "Stages, micro-batches and schedule come from the send/recv calls of the analysed steps; the "
        "declaration is only a cross-check.", None, {"mismatch": {k: {"declared": d, "measured": m} for k, d, m in wrong}})


def _missing_pipeline(con, run_id) -> Finding | None:
    """No pipeline found: say so only when the run has send/recv calls or declares a pipeline."""
    num_p2p = con.execute("SELECT count(*) FROM collectives WHERE run_id = ? AND is_p2p", [run_id]).fetchone()[0]
    [metadata] = con.execute("SELECT metadata FROM runs WHERE run_id = ?", [run_id]).fetchone()
    model = (json.loads(metadata) if metadata else {}).get("bprof_model") or {}
    declared = model.get("pp")
    if num_p2p:
        return not_measurable(
            "Pipeline bubbles not measurable: the send/recv calls do not form a pipeline",
            f"{num_p2p} send/recv calls, but no chain of stages in the analysed steps (no rank that sends "
            f"before it receives and has no upstream peer, nor a ring of stages, as interleaved 1F1B makes, "
            f"that closes on a rank starting its steps with a send), or no ProfilerStep ranges around them.",
            "Record with `bprof record` (it records the peer of each send/recv and marks the steps).",
            num_p2p_calls=num_p2p, declared_stages=declared)
    if isinstance(declared, int) and declared > 1:
        return not_measurable(
            "Pipeline bubbles not measurable: no send/recv calls in the trace",
            f"The training script declares pp={declared}, but the trace holds no send/recv call.",
            "Record with `bprof record` so that the pipeline's send/recv calls are traced.",
            declared_stages=declared)
    return None
