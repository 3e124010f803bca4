"""What `scale:X=F` predicts on the real GPU traces of ../shared/traces with the launch-level device
graph (bprof.whatif.device_graph) against the segment model it replaces on GPU ranks (X's kernel time
in each work segment x F, assumed on the critical path), and how long the device graph takes per
rank-step.

    .venv/bin/python benchmarks/whatif_device_graph.py                     # scale:gemm=0.8, scale:elementwise=0.8
    .venv/bin/python benchmarks/whatif_device_graph.py --scenario scale:gemm=0.5 --traces a100_ddp_nccl_rank0

Per trace: ingest, analyse (timeline, breakdown, match, clock, idle), then for each scenario, by
`bprof whatif` (device graph) and by the segment model (the same replay with Scale.model =
"segment"): the change of the job's step as whatif summarises it (median predicted step against
median measured step), the median over steps of each step's own change, and the gain over the
whole captured window (all steps together) beside (1 - F) x X's kernel time in the window (what a
fully GPU-bound rank would gain); X's kernel time per step (median).

Synthetic truth: bprof.synth runs (tp2 x dp2, NCCL-style streams, the host blocking only in
aten::item) healthy and with every compute kernel 2x slower; every compute class scaled by 0.5 in
one scenario from the slow run, against the healthy run's measured steps, by both models. Timing: building each
rank's graph of its captured steps (SQL read + numpy) and one replay of it (numba, compiled before
timing; median of 20), both per rank-step (divided by the rank's steps). Prints a table and, with --json, the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bprof.analyzers import run as analysis  # noqa: E402
from bprof.analyzers.base import Options  # noqa: E402
from bprof.store.db import open_store  # noqa: E402
from bprof.store.ingest import IngestOptions, ingest_paths  # noqa: E402
from bprof.whatif import device_graph  # noqa: E402
from bprof.whatif.run import whatif  # noqa: E402
from bprof.whatif.scenarios import Scale, parse, segment_model_steps  # noqa: E402

TRACES = ["a100_ddp_nccl_rank0", "a100_ws16_rank0", "v100_ns_resolution_rank0", "mi250_rocm_minitoy",
          "v100_resnet50_legacy_2021"]
SHARED = ROOT.parent / "shared" / "traces"


def analysed(folder: str, work: Path):
    con = open_store(work / f"{folder}.duckdb")
    [r] = ingest_paths(con, [SHARED / folder], IngestOptions(rank=0, work_dir=work))
    saved = analysis.ANALYZERS
    analysis.ANALYZERS = ["timeline", "breakdown", "match", "clock", "idle"]
    try:
        analysis.analyze_run(con, r.run_id, Options())
    finally:
        analysis.ANALYZERS = saved
    return con, r.run_id




def class_time_ns(con, run_id: int, names: list[str], total: bool = False) -> int:
    """Median over the analysed steps (or, with total, the sum) of the summed time of X's kernels
    launched in the step."""
    rows = con.execute("""SELECT step, sum(dur_ns) FROM events WHERE run_id = ? AND kind = 'kernel'
                          AND step IN (SELECT step FROM timeline_spans WHERE run_id = ?)
                          AND list_contains(?, name) GROUP BY step""", [run_id, run_id, names]).fetchall()
    values = [int(v) for _, v in rows]
    return (sum(values) if total else int(statistics.median(values))) if values else 0


def timings(con, run_id: int, part: Scale) -> dict:
    """Build and replay times of the run's rank graphs (one per rank, all its captured steps)."""
    device_graph.prepare(con, run_id)
    ranks = [r for (r,) in con.execute("SELECT DISTINCT rank FROM timeline_spans WHERE run_id = ? ORDER BY rank", [run_id]).fetchall()]
    build_s, replay_s, points, steps, blocked, events, dropped = [], [], [], 0, 0, 0, {}
    for rank in ranks:
        t0 = time.perf_counter()
        g = device_graph.rank_graph(con, run_id, rank)
        build_s.append(time.perf_counter() - t0)
        if g is None:
            continue
        w = g.weights(g.matching(part.names), part.factor)
        g.replay(w)  # compiled (cached) before timing
        reps = []
        for _ in range(20):
            t0 = time.perf_counter()
            g.replay(w)
            reps.append(time.perf_counter() - t0)
        replay_s.append(statistics.median(reps) / len(g.steps))
        points.append(len(g.measured_ns) / len(g.steps))
        steps += len(g.steps)
        blocked += int(g.blocked.sum())
        events += g.kept.get("event", 0)
        for k, v in g.dropped.items():
            dropped[k] = dropped.get(k, 0) + v
    return {"rank_steps": steps, "time_points_per_rank_step": int(statistics.median(points)) if points else 0,
            "build_s_per_rank_step": sum(build_s) / max(steps, 1),
            "replay_s_per_rank_step": statistics.median(replay_s) if replay_s else None,
            "blocked_calls": blocked, "event_edges": events, "dropped_edges": dropped}


def synthetic_truth(work: Path, factor: float = 2.0) -> dict:
    """bprof.synth (tp2 x dp2, one host, 3 steps, seed 5) healthy and with every compute kernel
    `factor` x slower (slow_host: the same random draws, only those kernels differ); from the slow
    run, every compute class on stream 7 scaled by 1/factor in one scenario, against the healthy
    run's measured job steps."""
    from bprof.kernels.classify import classify_many
    from bprof.synth import Fault, Scenario, write_run

    stores = {}
    for name, faults in (("healthy", []), ("slow", [Fault("slow_host", host=0, factor=factor)])):
        write_run(Scenario(tp=2, pp=1, dp=2, steps=3, hosts=1, seed=5, faults=faults), work / name)
        con = open_store(work / f"{name}.duckdb")
        [r] = ingest_paths(con, [work / name], IngestOptions(name=name, work_dir=work))
        analysis.analyze_run(con, r.run_id, Options())
        stores[name] = (con, r.run_id)
    con, run_id = stores["slow"]
    pairs = con.execute("SELECT DISTINCT name, 'kernel' FROM events WHERE run_id = ? AND kind = 'kernel' AND stream = 7",
                        [run_id]).fetchall()
    classes = sorted({fine for _, _, fine, _, _ in classify_many(pairs)} - {"unknown"})
    text = "+".join(f"scale:{c}={1 / factor:g}" for c in classes)
    out = whatif(con, run_id, [text], write=False)
    slow, device = out.results[1].job_steps()
    segment = segment_model_steps(con, run_id, parse(text))
    healthy, _ = whatif(*stores["healthy"], [], write=False).results[0].job_steps()
    for c, _ in stores.values():
        c.close()
    return {"scenario": text, "slow_ns": slow, "healthy_ns": healthy, "device_graph_ns": device, "segment_model_ns": segment}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", nargs="*", default=TRACES)
    ap.add_argument("--scenario", action="append", default=None, help="scale:X=F (repeatable)")
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--skip-synthetic", action="store_true", help="skip the synthetic-truth check")
    args = ap.parse_args()
    scenarios = args.scenario or ["scale:gemm=0.8", "scale:elementwise=0.8"]
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for folder in args.traces:
            work = Path(tmp) / folder
            work.mkdir()
            con, run_id = analysed(folder, work)
            t0 = time.perf_counter()
            out = whatif(con, run_id, scenarios, write=False)
            whatif_s = time.perf_counter() - t0
            for text, res, summary in zip(scenarios, out.results[1:], out.summaries[1:]):
                [part] = parse(text)
                measured, predicted = res.job_steps()
                segment = segment_model_steps(con, run_id, [part])
                meas = statistics.median(measured)
                rows.append({
                    "trace": folder, "scenario": text, "num_steps": len(measured), "measured_step_ns": int(meas),
                    "device_graph_step_ns": int(statistics.median(predicted)),
                    "segment_model_step_ns": int(statistics.median(segment)),
                    # whatif's summary: the median predicted step against the median measured one
                    "device_graph_delta_frac": statistics.median(predicted) / meas - 1,
                    "segment_model_delta_frac": statistics.median(segment) / meas - 1,
                    # the median over steps of each step's own change
                    "device_graph_step_delta_frac": statistics.median(p / m - 1 for p, m in zip(predicted, measured)),
                    "segment_model_step_delta_frac": statistics.median(p / m - 1 for p, m in zip(segment, measured)),
                    # the captured window: all steps' gain together, against (1 - F) x X's time in it
                    "device_graph_window_gain_ns": sum(measured) - sum(predicted),
                    "segment_model_window_gain_ns": sum(measured) - sum(segment),
                    "window_class_saving_ns": round((1 - part.factor) * class_time_ns(con, run_id, part.names, total=True)),
                    "class_time_ns": class_time_ns(con, run_id, part.names),
                    "whatif_s": whatif_s, **timings(con, run_id, part)})
            con.close()
        truth = None if args.skip_synthetic else synthetic_truth(Path(tmp))
    if args.json:
        print(json.dumps({"traces": rows, "synthetic": truth}, indent=1))
        return
    print(f"{'trace':25} {'scenario':21} {'steps':>5} {'step ms':>7} {'X ms':>6} | {'device graph: median':>20} {'per step':>8} "
          f"{'window ms':>9} | {'segment: median':>15} {'per step':>8} {'window ms':>9} | {'(1-F)X ms':>9} | "
          f"{'build ms':>8} {'replay us':>9} {'points':>6} {'blocked':>7} {'events':>6} dropped")
    for r in rows:
        print(f"{r['trace']:25} {r['scenario']:21} {r['num_steps']:5d} {r['measured_step_ns'] / 1e6:7.2f} "
              f"{r['class_time_ns'] / 1e6:6.2f} | {100 * r['device_graph_delta_frac']:+19.2f}% "
              f"{100 * r['device_graph_step_delta_frac']:+7.2f}% {r['device_graph_window_gain_ns'] / 1e6:9.2f} | "
              f"{100 * r['segment_model_delta_frac']:+14.2f}% {100 * r['segment_model_step_delta_frac']:+7.2f}% "
              f"{r['segment_model_window_gain_ns'] / 1e6:9.2f} | {r['window_class_saving_ns'] / 1e6:9.2f} | "
              f"{1e3 * r['build_s_per_rank_step']:8.1f} {1e6 * r['replay_s_per_rank_step']:9.1f} "
              f"{r['time_points_per_rank_step']:6d} {r['blocked_calls']:7d} {r['event_edges']:6d} {r['dropped_edges']}")

    if truth:
        print(f"\nsynthetic truth: {truth['scenario']} on the run with compute kernels 2x slower")
        for key in ("slow_ns", "healthy_ns", "device_graph_ns", "segment_model_ns"):
            print(f"  {key:17} " + " ".join(f"{v / 1e6:8.2f}" for v in truth[key]) + " ms")
        for key in ("device_graph_ns", "segment_model_ns"):
            err = [100 * (p / h - 1) for p, h in zip(truth[key], truth["healthy_ns"])]
            print(f"  {key:17} error vs healthy: " + " ".join(f"{e:+.2f}%" for e in err))


if __name__ == "__main__":
    main()
