"""How well `bprof whatif` predicts real runs, and how long its replay takes at fleet scale.

    .venv/bin/python benchmarks/whatif_accuracy.py                       # everything (~10 min here)
    .venv/bin/python benchmarks/whatif_accuracy.py --skip-accuracy --ranks 1024 4096
    .venv/bin/python benchmarks/whatif_accuracy.py --dir bench-data/whatif --keep
    .venv/bin/python benchmarks/whatif_accuracy.py --skip-scale --cases b      # (b) alone
    .venv/bin/python benchmarks/whatif_accuracy.py --skip-scale --rounds 3     # interleaved repeats

Accuracy (issue 10, (a), (b) and (c)). (a), (c): records examples/train_gpt.py under `bprof
record` (torchrun, 2 CPU ranks, gloo, data parallel, steps 3:9) in four configurations: healthy twice (the run-to-run noise), with an injected straggler
(--slow-rank 1 --slow-ms SLOW_MS) and with an injected data-loading stall (--dataloader-stall-ms
STALL_MS). Each is analysed; `no-stragglers` is predicted from the straggler run and
`no-host-gaps` from the stall run, and each prediction is compared with the measured step of the
healthy runs (job step: the longest rank's span, median over steps). Because `no-host-gaps`
also removes the ordinary host gaps (Python between ops) that the healthy run keeps, the healthy
run's own `no-host-gaps` prediction is printed too: the part of the error that is that definition,
not the replay.

(b): the same trainer as a 2-stage pipeline (`--pp 2 --dp 1`, 1F1B, the same --batch) with 4
micro-batches, recorded twice (first and last: the noise), and with 8; `microbatches=8` is
predicted from each 4-micro-batch run and compared with the 8-micro-batch run's measured step
(and `microbatches=4` from the 8-micro-batch run, the other way).

With --rounds R (R >= 2) the configurations are instead recorded round after round, every
configuration once per round (healthy, straggler, stall, 4 and 8 micro-batches), so each faulted
run has a healthy (or other-count) run recorded next to it under the same load: each prediction is
compared with its own round's run, and printed per round with the median and range over rounds,
beside the noise, the spread of the same configuration's measured step over the rounds.

Every recording, analysis and prediction runs from a copy of bprof/ and examples/ taken when the
script starts (benchmarks/_code.py): editing the tree during a 30-round run does not reach it. The
commit (marked +uncommitted when those folders differed from it) is printed and in --json's "code".

Scale: bprof.synth.fleet runs (TP8 x PP8 x DP(N/64), 16 micro-batches of 1F1B, one step, rank 333
1.3x slower) analysed, then `whatif` timed: the unchanged replay alone, and with no-stragglers.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _code import child_env, describe, snapshot  # noqa: E402  (benchmarks/_code.py)

CODE = ROOT  # replaced in main() by a copy of bprof/ and examples/ taken at the start

SLOW_MS = 300
STALL_MS = 100
ARGS = ["--tp", "1", "--dp", "2", "--steps", "10"]


def record(out: Path, name: str, extra: list[str]) -> Path:
    """bprof record of train_gpt.py on 2 CPU ranks into out/<name>.duckdb, analysed."""
    db = out / f"{name}.duckdb"
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(out / name), "--db", str(db), "--name", name,
           "--steps", "3:9", "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(CODE / "examples" / "train_gpt.py"), *ARGS, *extra]
    for attempt in range(2):  # torch 2.13 + gloo can abort a rank at interpreter exit (README): rerun once
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=out, env=child_env(CODE, OMP_NUM_THREADS="1"))
        if done.returncode == 0:
            break
        shutil.rmtree(out / name, ignore_errors=True)
        db.unlink(missing_ok=True)
    if done.returncode != 0:
        raise SystemExit(f"recording {name} failed:\n{done.stderr[-3000:]}")
    analysed = subprocess.run([sys.executable, "-m", "bprof.cli.main", "analyze", "--db", str(db), "--json"],
                              capture_output=True, text=True, cwd=out, env=child_env(CODE))
    if analysed.returncode != 0:
        raise SystemExit(f"analysing {name} failed:\n{analysed.stderr[-3000:]}")
    return db


def predict(db: Path, scenarios: list[str]) -> list[dict]:
    from bprof.store.db import open_store
    from bprof.whatif.run import whatif

    con = open_store(db)
    try:
        [(run_id,)] = con.execute("SELECT run_id FROM runs").fetchall()
        return whatif(con, run_id, scenarios).summaries
    finally:
        con.close()


PP_ARGS = ["--dp", "1", "--pp", "2"]  # after ARGS: --dp 1 overrides


def pipeline(out: Path) -> dict:
    """(b): microbatches=8 predicted from two 4-micro-batch pipeline runs against a recorded 8."""
    t0 = time.time()
    dbs = {name: record(out, name, [*PP_ARGS, "--microbatches", str(m)])
           for name, m in [("pp_mb4_1", 4), ("pp_mb8", 8), ("pp_mb4_2", 4)]}
    print(f"recorded and analysed 3 pipeline runs in {time.time() - t0:.0f} s", flush=True)
    four = {n: predict(dbs[n], ["microbatches=4", "microbatches=8"]) for n in ("pp_mb4_1", "pp_mb4_2")}
    eight = predict(dbs["pp_mb8"], ["microbatches=8", "microbatches=4"])
    measured4 = [f[0]["measured_step_ns"] for f in four.values()]
    measured8 = eight[0]["measured_step_ns"]
    ref4 = statistics.mean(measured4)
    res = {"mb4_measured_ns": measured4, "mb8_measured_ns": measured8,
           "mb4_noise_frac": abs(measured4[0] - measured4[1]) / ref4,
           "mb4_reproduced": [f[1]["predicted_step_ns"] == f[0]["measured_step_ns"] for f in four.values()],
           "mb8_from_mb4_ns": [f[2]["predicted_step_ns"] for f in four.values()],
           "mb8_from_mb4_error_frac": [(f[2]["predicted_step_ns"] - measured8) / measured8 for f in four.values()],
           "mb4_from_mb8_ns": eight[2]["predicted_step_ns"],
           "mb4_from_mb8_error_frac": (eight[2]["predicted_step_ns"] - ref4) / ref4,
           "unchanged_replay_max_error_frac": max(x[0]["max_error_frac"] for x in [*four.values(), eight]),
           "assumptions": eight[2]["assumptions"]}
    print(f"(b) pp2 1F1B: 4 micro-batches measured {measured4[0] / 1e6:.1f} and {measured4[1] / 1e6:.1f} ms "
          f"(run-to-run difference {res['mb4_noise_frac']:.1%}), 8 measured {measured8 / 1e6:.1f} ms; "
          "microbatches=8 predicted " + ", ".join(f"{p / 1e6:.1f} ms ({e:+.1%})" for p, e in
                                                zip(res["mb8_from_mb4_ns"], res["mb8_from_mb4_error_frac"]))
          + f"; microbatches=4 from the 8-run {res['mb4_from_mb8_ns'] / 1e6:.1f} ms ({res['mb4_from_mb8_error_frac']:+.1%} "
          f"vs the 4-runs' mean); microbatches=4 on the 4-runs reproduces them: {res['mb4_reproduced']}", flush=True)
    return res


def accuracy(out: Path) -> dict:
    t0 = time.time()
    dbs = {name: record(out, name, extra) for name, extra in [
        ("healthy1", []), ("slow", ["--slow-rank", "1", "--slow-ms", str(SLOW_MS)]),
        ("stall", ["--dataloader-stall-ms", str(STALL_MS)]), ("healthy2", [])]}
    print(f"recorded and analysed 4 runs in {time.time() - t0:.0f} s", flush=True)
    healthy = {n: predict(dbs[n], ["no-host-gaps"]) for n in ("healthy1", "healthy2")}
    measured = [h[0]["measured_step_ns"] for h in healthy.values()]
    ref = statistics.mean(measured)
    noise = abs(measured[0] - measured[1]) / ref
    slow = predict(dbs["slow"], ["no-stragglers"])
    stall = predict(dbs["stall"], ["no-host-gaps"])
    res = {"healthy_measured_ns": measured, "noise_frac": noise}
    for key, summaries in (("a_no_stragglers", slow), ("c_no_host_gaps", stall)):
        base, pred = summaries
        res[key] = {"measured_ns": base["measured_step_ns"], "predicted_ns": pred["predicted_step_ns"],
                    "unchanged_replay_max_error_frac": base["max_error_frac"],
                    "error_frac": (pred["predicted_step_ns"] - ref) / ref, "assumptions": pred["assumptions"]}
    res["healthy_no_host_gaps_ns"] = [h[1]["predicted_step_ns"] for h in healthy.values()]
    print(f"healthy runs: {measured[0] / 1e6:.1f} and {measured[1] / 1e6:.1f} ms per step "
          f"(run-to-run difference {noise:.1%}); no-host-gaps on them: "
          + ", ".join(f"{v / 1e6:.1f} ms" for v in res["healthy_no_host_gaps_ns"]))
    for key, label in (("a_no_stragglers", f"(a) --slow-rank 1 --slow-ms {SLOW_MS}, no-stragglers"),
                       ("c_no_host_gaps", f"(c) --dataloader-stall-ms {STALL_MS}, no-host-gaps")):
        r = res[key]
        print(f"{label}: measured {r['measured_ns'] / 1e6:.1f} ms, predicted {r['predicted_ns'] / 1e6:.1f} ms, "
              f"healthy {ref / 1e6:.1f} ms: error {r['error_frac']:+.1%} (unchanged replay within "
              f"{r['unchanged_replay_max_error_frac']:.4%})", flush=True)
    return res


def interleaved(out: Path, rounds: int, cases: set[str]) -> dict:
    """Every configuration once per round, rounds after one another; predictions against their own round."""
    configs = [("healthy", [])] if cases & {"a", "c"} else []
    configs += [("slow", ["--slow-rank", "1", "--slow-ms", str(SLOW_MS)])] if "a" in cases else []
    configs += [("stall", ["--dataloader-stall-ms", str(STALL_MS)])] if "c" in cases else []
    configs += [("mb4", [*PP_ARGS, "--microbatches", "4"]), ("mb8", [*PP_ARGS, "--microbatches", "8"])] if "b" in cases else []
    t0 = time.time()
    dbs = [{name: record(out, f"{name}_r{i}", extra) for name, extra in configs} for i in range(rounds)]
    print(f"recorded and analysed {rounds} rounds of {len(configs)} runs in {time.time() - t0:.0f} s", flush=True)
    checks = [("a", "slow", "no-stragglers", "healthy"), ("c", "stall", "no-host-gaps", "healthy"),
              ("c", "healthy", "no-host-gaps", "healthy"), ("b", "mb4", "microbatches=8", "mb8"),
              ("b", "mb8", "microbatches=4", "mb4")]
    res: dict = {"rounds": rounds, "measured_ns": {}, "predictions": []}
    res["parts_ns"] = {}
    for name, _ in configs:
        steps = [predict(r[name], [])[0]["measured_step_ns"] for r in dbs]
        res["measured_ns"][name] = steps
        res["parts_ns"][name] = parts = [_parts(r[name]) for r in dbs]
        spread = (max(steps) - min(steps)) / statistics.median(steps)
        print(f"{name}: measured " + ", ".join(f"{v / 1e6:.1f}" for v in steps) + f" ms over the rounds "
              f"(spread {spread:.1%}); per rank-step median compute / exposed comm / idle+other: "
              + ", ".join("/".join(f"{v / 1e6:.1f}" for v in p) for p in parts) + " ms", flush=True)
    for case, source, scenario, target in checks:
        if case not in cases:
            continue
        errors, predicted = [], []
        for r, measured in zip(dbs, res["measured_ns"][target]):
            pred = predict(r[source], [scenario])[1]["predicted_step_ns"]
            predicted.append(pred)
            errors.append((pred - measured) / measured)
        res["predictions"].append({"case": case, "from": source, "scenario": scenario, "against": target,
                                   "predicted_ns": predicted, "error_frac": errors})
        print(f"({case}) {scenario} from {source} vs {target} of the same round: "
              + ", ".join(f"{p / 1e6:.1f} ms ({e:+.1%})" for p, e in zip(predicted, errors))
              + f"; median {statistics.median(errors):+.1%}, range {min(errors):+.1%} to {max(errors):+.1%}, mean "
              f"{statistics.mean(errors):+.1%} +- {statistics.stdev(errors) / len(errors) ** 0.5:.1%} (standard error)",
              flush=True)
    return res


def _parts(db: Path) -> tuple[float, float, float]:
    """Median over rank-steps of breakdown_steps' compute, exposed communication and idle + other (ns):
    where a prediction's residual sits (a faulted run's compute slower than a healthy run's, say)."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute("""SELECT median(compute_ns), median(exposed_comm_ns), median(idle_ns + other_ns)
                              FROM breakdown_steps WHERE step >= 0""").fetchone()
    finally:
        con.close()


def scale(out: Path, sizes: list[int]) -> dict:
    from bprof.analyzers import run as analysis
    from bprof.analyzers.base import Options
    from bprof.store.db import open_store
    from bprof.synth.fleet import Fleet, write_fleet
    from bprof.whatif.run import whatif

    res = {}
    for n in sizes:
        con = open_store(out / f"fleet{n}.duckdb")
        t0 = time.time()
        truth = write_fleet(con, Fleet(tp=8, pp=8, dp=n // 64, steps=1, slow_rank=333 % n, slow_factor=1.3))
        analysis.analyze_run(con, truth.run_id, Options(), )
        setup = time.time() - t0
        rows = con.execute("SELECT count(*) FROM match_members WHERE run_id = ?", [truth.run_id]).fetchone()[0]
        times = {}
        for label, scenarios in (("unchanged", []), ("no_stragglers", ["no-stragglers"])):
            best = None
            for _ in range(3):
                t = time.perf_counter()
                out_ = whatif(con, truth.run_id, scenarios, write=False)
                best = min(best or 1e9, time.perf_counter() - t)
            times[label] = best
        summary = out_.summaries
        res[n] = {"member_rows": rows, "seconds": times, "setup_s": setup,
                  "max_error_frac": summary[0]["max_error_frac"], "delta_frac": summary[1]["delta_frac"],
                  "truth_delta_frac": (truth.healthy_step_ns[0] - truth.step_ns[0]) / truth.step_ns[0]}
        print(f"{n:,} ranks ({rows:,} member rows, one step): whatif unchanged {times['unchanged']:.2f} s, "
              f"with no-stragglers {times['no_stragglers']:.2f} s (best of 3; store written and analysed in {setup:.0f} s); "
              f"unchanged error {summary[0]['max_error_frac']:.4%}; no-stragglers {res[n]['delta_frac']:+.2%} "
              f"(truth {res[n]['truth_delta_frac']:+.2%})", flush=True)
        con.close()
    base = sizes[0]
    for n in sizes[1:]:
        print(f"{n:,} vs {base:,} ranks: rows x{res[n]['member_rows'] / res[base]['member_rows']:.1f}, "
              f"time x{res[n]['seconds']['unchanged'] / res[base]['seconds']['unchanged']:.1f}")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--skip-scale", action="store_true")
    ap.add_argument("--cases", default="a,b,c", help="accuracy cases to run: a and c (data parallel), b (pipeline)")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    ap.add_argument("--rounds", type=int, default=1, help="record every configuration once per round, interleaved (see above)")
    a = ap.parse_args()
    out = a.dir or Path(tempfile.mkdtemp(prefix="bprof-whatif-"))
    out.mkdir(parents=True, exist_ok=True)
    global CODE
    results = {"code": describe(ROOT)}
    CODE = snapshot(ROOT, out)  # edits to the tree from now on do not reach this run
    print(f"bprof {results['code']}, run from a copy in {CODE}", flush=True)
    try:
        cases = set(a.cases.split(","))
        if not a.skip_accuracy and a.rounds > 1:
            results["interleaved"] = interleaved(out, a.rounds, cases)
        elif not a.skip_accuracy and cases & {"a", "c"}:
            results["accuracy"] = accuracy(out)
        if not a.skip_accuracy and a.rounds <= 1 and "b" in cases:
            results["pipeline"] = pipeline(out)
        if not a.skip_scale:
            results["scale"] = scale(out, a.ranks)
    finally:
        if not a.keep:
            shutil.rmtree(out, ignore_errors=True)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
