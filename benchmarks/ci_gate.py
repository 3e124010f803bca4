"""Can `bprof ci check` be trusted both ways on this noisy machine? A/A: unchanged runs must not be
called regressions; A/B: planted 5% and 10% slowdowns must be, with the right cause ranked first.

    nice -n 10 .venv/bin/python benchmarks/ci_gate.py --out /work/scratch/ci_gate   # ~25-40 min
    .venv/bin/python benchmarks/ci_gate.py --out DIR --baseline 5 --aa 2 --ab 1       # a smoke run
    .venv/bin/python benchmarks/ci_gate.py --reanalyse DIR/results.json              # the rates again
    .venv/bin/python benchmarks/ci_gate.py --rescore DIR/bench.duckdb               # today's gate, old runs

One set of settings for everything (printed at the start):
- the run: `bprof record --steps 3:8` of examples/train_gpt.py on 2 CPU ranks (torchrun, gloo,
  OMP_NUM_THREADS=1, --tp 1 --dp 2 --layers 2 --hidden 64 --seq 64, 9 steps), analysed by
  `bprof ci check` itself; MFU's peak from one `bprof calibrate` at the start;
- the baseline: --baseline runs recorded first, each added to series main (`bprof ci record`);
- then rounds of [A/A, A/B 5%, A/A, A/B 10%, A/A, A/B config] until --aa A/A and --ab of each A/B
  are done (--config of the config arm), so that
  the machine's drift meets every arm alike. A/A candidates are unchanged runs; after its check each
  joins series main, as a merged unchanged commit would (the gate compares with the last 10 runs);
- A/B candidates plant a slowdown with `--slow-rank 1 --slow-ms X`: X is 5% or 10% of the median step
  time of the baseline series (rank 1 computes X ms more per step; rank 0 waits for it); A/B config
  candidates run a slower configuration, `--no-bucket` (DP gradients all-reduced one tensor at a time);
- every candidate is checked with `bprof ci check --metric step_time --metric mfu --metric executed_flops
  --metric collective_calls --threshold 3% --confidence 0.99 --baseline main` (last 10 comparable runs):
  the time metrics and two work metrics (amounts per step, which the machine's load does not move).

--rescore replays the gate on the runs of an earlier --out's store with today's bprof: each run is
summarised again from its analysed tables and checked, in recording order, against the baseline and
A/A runs before it (the series as the gate had built it), so a change to the gate is measured on the
same recordings.

Scored: A/A exit 0 = right, exit 1 = false alarm, exit 3 = failure. A/B config: exit 1 with more
collective calls as the largest change of work = detected with the right cause. A/B exit 1 with the explanation's
first part `compute` on the slow rank = detected with the right cause; exit 1 otherwise = detected,
wrong cause; exit 0 = missed; exit 3 = failure. Every check's JSON and every run's summary are kept
under --out (results.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAINER = ROOT / "examples" / "train_gpt.py"
TRAINER_ARGS = ["--tp", "1", "--dp", "2", "--layers", "2", "--hidden", "64", "--seq", "64", "--steps", "9"]
STEPS = "3:8"
NPROC = 2
SLOW_RANK = 1
BENCHMARK = "gpt-tiny-cpu2"
UPSTREAM_EXIT_ABORT = "terminate called without an active exception"  # torch 2.13 at interpreter exit


def bprof(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})


def record(out: Path, name: str, extra: list[str]) -> str:
    """One recorded run into out/bench.duckdb; retried once when torch aborted at exit."""
    for attempt in range(2):
        run_name = name if attempt == 0 else f"{name}-retry"
        done = bprof("record", "--out", str(out / "runs" / run_name), "--db", "bench.duckdb", "--name", run_name,
                     "--steps", STEPS, "--benchmark", BENCHMARK, "--branch", "main", "--",
                     sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}",
                     str(TRAINER), *TRAINER_ARGS, *extra, cwd=out)
        if done.returncode == 0:
            return run_name
        if UPSTREAM_EXIT_ABORT not in done.stderr:
            break
    raise SystemExit(f"recording {name} failed:\n{done.stderr[-3000:]}")


METRICS = ("step_time", "mfu", "executed_flops", "collective_calls")


def check(out: Path, run: str) -> tuple[int, dict]:
    done = bprof("ci", "check", run, "--db", "bench.duckdb", *[a for m in METRICS for a in ("--metric", m)], "--json",
                 cwd=out)
    try:
        data = json.loads(done.stdout)
    except ValueError:
        data = {"status": "error", "reason": done.stderr.strip()}
    return done.returncode, data


def ci_record(out: Path, run: str) -> None:
    done = bprof("ci", "record", run, "--db", "bench.duckdb", "--branch", "main", cwd=out)
    if done.returncode != 0:
        raise SystemExit(f"ci record {run} failed: {done.stderr}")


def median_step_ms(out: Path) -> float:
    import duckdb

    con = duckdb.connect(str(out / "bench.duckdb"), read_only=True)
    try:
        return con.execute("""SELECT median(m.value) / 1e6 FROM ci_metrics m JOIN ci_runs r USING (history_id)
                              WHERE r.series = 'main' AND m.metric = 'step_time_ns'""").fetchone()[0]
    finally:
        con.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="work directory (must not hold a previous bench.duckdb)")
    parser.add_argument("--reanalyse", type=Path, help="print the rates of a previous run's results.json and exit")
    parser.add_argument("--rescore", type=Path, help="check the runs of a previous run's bench.duckdb again and exit")
    parser.add_argument("--baseline", type=int, default=10, help="baseline runs recorded first")
    parser.add_argument("--aa", type=int, default=20, help="A/A candidates")
    parser.add_argument("--ab", type=int, default=10, help="A/B candidates of each planted slowdown")
    parser.add_argument("--config", type=int, default=5, help="A/B candidates of the slower configuration (--no-bucket)")
    args = parser.parse_args()
    if args.reanalyse:
        saved = json.loads(args.reanalyse.read_text())
        print(f"baseline median step {saved['baseline_step_ms']:.2f} ms; planted --slow-ms {saved['slow_ms']}")
        print_rates(saved["results"], args)
        return 0
    if args.rescore:
        print_rates(rescore(args.rescore), args)
        return 0
    if args.out is None:
        parser.error("--out is required")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if (out / "bench.duckdb").exists():
        raise SystemExit(f"{out / 'bench.duckdb'} exists: pick a fresh --out")
    started = time.time()
    print(f"ci_gate: {NPROC} CPU ranks, train_gpt {' '.join(TRAINER_ARGS)}, bprof record --steps {STEPS}; "
          f"{args.baseline} baseline runs, {args.aa} A/A, {args.ab} A/B at 5% and at 10%, {args.config} --no-bucket; "
          f"check: {' '.join('--metric ' + m for m in METRICS)} --threshold 3% --confidence 0.99, last 10 runs; "
          f"load average {os.getloadavg()}", flush=True)
    cal = bprof("calibrate", "--db", "bench.duckdb", "--dtype", "fp32", cwd=out)
    if cal.returncode != 0:
        raise SystemExit(f"calibrate failed: {cal.stderr}")
    for i in range(args.baseline):
        name = record(out, f"base{i:02d}", [])
        ci_record(out, name)
        print(f"baseline {name}", flush=True)
    step_ms = median_step_ms(out)
    slow_ms = {"ab5": round(0.05 * step_ms, 2), "ab10": round(0.10 * step_ms, 2)}
    print(f"baseline median step {step_ms:.2f} ms: planted --slow-ms {slow_ms['ab5']} (5%) and {slow_ms['ab10']} (10%) "
          f"on rank {SLOW_RANK}", flush=True)

    results = []
    todo = {"aa": args.aa, "ab5": args.ab, "ab10": args.ab, "abcfg": args.config}
    pattern = ["aa", "ab5", "aa", "ab10", "aa", "abcfg"]
    k = 0
    while any(todo.values()):
        arm = pattern[k % len(pattern)]
        k += 1
        if not todo[arm]:
            continue
        todo[arm] -= 1
        if arm == "aa":
            extra = []
        elif arm == "abcfg":
            extra = ["--no-bucket"]
        else:
            extra = ["--slow-rank", str(SLOW_RANK), "--slow-ms", str(slow_ms[arm])]
        name = record(out, f"{arm}-{k:03d}", extra)
        rc, data = check(out, name)
        if arm == "aa" and rc in (0, 1):
            ci_record(out, name)  # unchanged code joins main's history, regression or not (as a merge would)
        results.append(score(arm, name, rc, data))
        r = results[-1]
        print(f"{arm:5} {name:12} exit {rc}  {r['outcome']:24} step {r['change']}  {r['why'][:110]}", flush=True)
    (out / "results.json").write_text(json.dumps({"slow_ms": slow_ms, "baseline_step_ms": step_ms,
                                                   "results": results}, indent=1))
    print_rates(results, args)
    print(f"ci_gate: {(time.time() - started) / 60:.1f} min; load average at the end {os.getloadavg()}")
    return 0


def rescore(store: Path) -> list[dict]:
    """The gate's checks again, in process, on the recorded runs of `store` (opened read-only)."""
    import duckdb

    from bprof.ci.check import CheckOptions, NotEnoughData, check as ci_check
    from bprof.ci.history import Entry
    from bprof.ci.report import check_data
    from bprof.ci.summary import summarize

    con = duckdb.connect(str(store), read_only=True)
    options = CheckOptions(metrics=METRICS)
    series, results = [], []
    for run_id, name in con.execute("SELECT run_id, name FROM runs ORDER BY run_id").fetchall():
        arm = name.split("-")[0] if "-" in name else "base"
        summary = summarize(con, run_id)
        if arm == "base":
            series.append(Entry(len(series) + 1, "main", summary))
            continue
        try:
            data, rc = check_data(ci_check(summary, series, options, "main")), 0
            rc = {"regression": 1, "inconclusive": 3}.get(data["status"], 0)  # as `bprof ci check` exits
        except NotEnoughData as exc:
            data, rc = {"status": "error", "reason": str(exc)}, 3
        if arm == "aa" and rc in (0, 1):
            series.append(Entry(len(series) + 1, "main", summary))
        results.append(score(arm, name, rc, data))
        r = results[-1]
        print(f"{arm:5} {name:12} exit {rc}  {r['outcome']:24} step {r['change']}  {r['why'][:110]}", flush=True)
    con.close()
    return results


def score(arm: str, name: str, rc: int, data: dict) -> dict:
    """Right cause: the largest change of work is more executed FLOPs on the slow rank, or (no work
    changed) compute is the part that grew most, on the slow rank as the critical rank."""
    step = next((m for m in data.get("metrics", []) if m["metric"] == "step_time"), None)
    e = data.get("explanation") or {}
    work = e.get("work") or []
    if arm == "abcfg":
        right_cause = bool(work) and work[0]["family"] == "work_calls" and work[0]["candidate"] > work[0]["baseline"]
    elif work:
        right_cause = (work[0]["family"] == "work_flops" and work[0]["name"] == f"rank {SLOW_RANK}"
                       and work[0]["candidate"] > work[0]["baseline"])
    else:
        right_cause = e.get("top_part") == "compute" and e.get("critical_rank") == SLOW_RANK
    if rc == 3 or rc not in (0, 1):
        outcome = "failure (exit %d)" % rc
    elif arm == "aa":
        outcome = "false alarm" if rc == 1 else "pass"
    elif rc == 1:
        outcome = "detected, right cause" if right_cause else "detected, wrong cause"
    else:
        outcome = "missed"
    return {"arm": arm, "run": name, "exit": rc, "outcome": outcome, "right_cause_first": right_cause,
            "change": f"{step['change_frac']:+.1%}" if step else "?", "p_value": step["p_value"] if step else None,
            "why": e.get("headline") or data.get("reason", ""), "check": data}


def print_rates(results: list[dict], args) -> None:
    aa = [r for r in results if r["arm"] == "aa"]
    alarms = sum(r["outcome"] == "false alarm" for r in aa)
    aa_fail = sum(r["outcome"].startswith("failure") for r in aa)
    improvements = sum(any(m["verdict"] == "improvement" for m in r["check"].get("metrics", [])) for r in aa)
    print(f"A/A: {len(aa)} unchanged candidates: {alarms} false alarms, {aa_fail} exit 3; "
          f"false-alarm rate {(alarms + aa_fail) / max(len(aa), 1):.0%} (exit 3 counted as a failure); "
          f"improvements called (exit 0) {improvements}")
    bands = sorted(m["band_high"] / m["baseline_center"] - 1 for r in results for m in r["check"].get("metrics", [])
                   if m["metric"] == "step_time")
    changes = sorted(abs(m["change_frac"]) for r in aa for m in r["check"].get("metrics", []) if m["metric"] == "step_time")
    if bands:
        print(f"noise: the step-time band's upper edge was +{bands[len(bands) // 2]:.1%} over the baseline (median "
              f"over checks; range +{bands[0]:.1%} to +{bands[-1]:.1%}); A/A |change| median {changes[len(changes) // 2]:.1%}, "
              f"max {changes[-1]:.1%}")
    for arm, label in (("ab5", "5%"), ("ab10", "10%"), ("abcfg", "config (--no-bucket)")):
        rows = [r for r in results if r["arm"] == arm]
        right = sum(r["outcome"] == "detected, right cause" for r in rows)
        wrong = sum(r["outcome"] == "detected, wrong cause" for r in rows)
        missed = sum(r["outcome"] == "missed" for r in rows)
        fail = sum(r["outcome"].startswith("failure") for r in rows)
        cause_first = sum(r["right_cause_first"] for r in rows)
        print(f"A/B {label}: {len(rows)} candidates: detected with the right cause first {right}, detected with "
              f"another cause {wrong}, missed {missed}, exit 3 {fail}; detection rate {(right + wrong) / max(len(rows), 1):.0%}, "
              f"right cause ranked first in {cause_first}/{len(rows)} (detected or not)")


if __name__ == "__main__":
    sys.exit(main())
