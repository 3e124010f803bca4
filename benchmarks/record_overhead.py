"""What `bprof record` costs a training job: outside its step window (goal: at most 1 %) and inside.

    .venv/bin/python benchmarks/record_overhead.py            # 10 pairs, several minutes
    .venv/bin/python benchmarks/record_overhead.py --quick    # 3 pairs, a smoke run
    .venv/bin/python benchmarks/record_overhead.py --pairs 20 --steps 40 --window 15:18

What it runs. examples/train_gpt.py on 4 CPU ranks (`torchrun --standalone --nproc_per_node=4
... --tp 2 --dp 2`, OMP_NUM_THREADS=1, gloo), once plainly and once under
`bprof record --no-ingest --steps <window>`, as a pair; the order inside a pair alternates
(pair 1 plain first, pair 2 bprof first, ...) so that drift of a shared machine hits both arms
equally. TORCH_FR_BUFFER_SIZE is removed from both arms' environment, so the bprof arm carries
the Flight Recorder that bprof turns on and the plain arm does not.

What a step costs. Every rank writes its `step_ms` per step (`--log-json`); the job's time for a
step is the slowest rank's `step_ms`. Ranks meet in collectives every step, so a cost on any one
rank shows first as that rank's longer step (rank 0 alone would see it only as waiting, and
possibly a step later). The first `--warmup` steps are dropped.

Where bprof's work lands. bprof acts in torch's optimizer-step post-hook, which train_gpt.py times
inside the step. For a window A:B (iterations A..B-1 profiled):
  start step   A-1      the profiler starts at the end of this step
  inside       A..B-2   fully profiled steps
  export       B-1, B   the profiler stops and each rank writes its trace at the end of step B-1;
                        ranks that finish writing sooner wait for the slowest in step B. The export
                        cost is the per-rank sum of step_ms over B-1 and B, slowest rank (the sum is
                        nearly the same on every rank because they meet again in step B)
  outside      every other step after warm-up
Per pair: outside ratio = median outside step (bprof) / median outside step (plain); inside ratio
likewise over the inside steps, and once more against each run's own outside median (in/out:
(inside/outside of bprof) / (inside/outside of plain), which cancels load that slows a whole run);
the start step's and the export's extra milliseconds, each taken over its own run's median outside
step first (start: step - median; export: sum of 2 steps - 2 medians), then bprof minus plain;
and the extra wall time of the whole run (bprof's launcher, hook install and export included).

How to read the output. Each line gives the mean over pairs and its 95 % confidence interval
(Student's t over pairs, n-1 degrees of freedom). The verdict says "no measurable overhead" only
when the outside-window interval contains 1.0 and its upper end is at most 1.01; otherwise it says
what was measured (an overhead, or an interval too wide to tell). The spread line says how many
pairs a +-1 % interval would need at the spread this run saw. Per-pair values, every run's per-rank
step times and the machine's load average are written to --out (JSON); `--reanalyse FILE` prints
the report again from such a file without running anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench-data"
NPROC = 4
LAYOUT = ("--tp", "2", "--dp", "2")
GOAL_RATIO = 1.01  # outside the window: at most 1 % slower
RUN_TIMEOUT_S = 900


class BenchmarkError(Exception):
    """A run failed or its output cannot be used; the message says which and how."""


@dataclass(frozen=True)
class Plan:
    steps: int
    start: int  # window A:B, half-open
    end: int
    warmup: int

    @property
    def start_step(self) -> int:
        return self.start - 1

    @property
    def inside(self) -> list[int]:
        return list(range(self.start, self.end - 1))

    @property
    def export(self) -> list[int]:
        return [self.end - 1, self.end]

    @property
    def outside(self) -> list[int]:
        return [s for s in range(self.warmup, self.steps) if not self.start - 1 <= s <= self.end]


def make_plan(steps: int, window: str, warmup: int) -> Plan:
    try:
        start, end = (int(x) for x in window.split(":"))
    except ValueError:
        raise BenchmarkError(f"--window {window!r} is not A:B (half-open iteration indices, e.g. 10:13)") from None
    plan = Plan(steps, start, end, warmup)
    if end - start < 2:
        raise BenchmarkError(f"--window {window}: needs at least 2 iterations (the last one also exports the trace, "
                             "so a 1-iteration window has no inside step to measure)")
    if start - 1 < warmup:
        raise BenchmarkError(f"--window {window}: starts inside the {warmup} warm-up steps (--warmup)")
    if end >= steps:
        raise BenchmarkError(f"--window {window}: needs --steps > {end}, so that the step after the window is run")
    if len(plan.outside) < 3:
        raise BenchmarkError(f"only {len(plan.outside)} steps outside the window; raise --steps")
    return plan


# ------------------------------------------------------------------------------------------------
# One run


def trainer_command(plan: Plan, log_json: Path) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}",
            "examples/train_gpt.py", *LAYOUT, "--steps", str(plan.steps), "--log-json", str(log_json)]


def run_once(plan: Plan, arm: str, workdir: Path) -> dict:
    """One training job, plain or under bprof record; returns its wall time and per-rank step_ms."""
    workdir.mkdir(parents=True)
    trainer = trainer_command(plan, workdir / "log{rank}.jsonl")
    if arm == "bprof":
        bprof = str(Path(sys.executable).with_name("bprof"))
        command = [bprof, "record", "--no-ingest", "--steps", f"{plan.start}:{plan.end}",
                   "--out", str(workdir / "run"), "--", *trainer]
    else:
        command = trainer
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)  # bprof sets it only where unset: the plain arm runs without
    output = workdir / "output.txt"
    t0 = time.perf_counter()
    with output.open("w") as f:
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BenchmarkError(f"{arm} run did not finish in {RUN_TIMEOUT_S} s: {' '.join(command)}\n"
                                 f"output: {output}") from None
    wall_s = time.perf_counter() - t0
    if done.returncode != 0:
        tail = "\n".join(output.read_text(errors="replace").splitlines()[-30:])
        raise BenchmarkError(f"{arm} run exited with {done.returncode}: {' '.join(command)}\n"
                             f"last lines of its output ({output}):\n{tail}")
    step_ms = read_step_ms(workdir, plan.steps)
    if arm == "bprof":
        check_capture(workdir / "run", plan)
    return {"arm": arm, "wall_s": wall_s, "step_ms_by_rank": step_ms}


def read_step_ms(workdir: Path, steps: int) -> list[list[float]]:
    """step_ms[rank][step] from the trainer's --log-json files."""
    by_rank = []
    for rank in range(NPROC):
        path = workdir / f"log{rank}.jsonl"
        if not path.exists():
            raise BenchmarkError(f"rank {rank} wrote no --log-json file ({path})")
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        times = {r["step"]: r["step_ms"] for r in rows if r.get("kind") == "step"}
        if sorted(times) != list(range(steps)):
            raise BenchmarkError(f"{path}: step lines for {sorted(times)}, expected 0..{steps - 1}")
        by_rank.append([times[s] for s in range(steps)])
    return by_rank


def check_capture(run_dir: Path, plan: Plan) -> None:
    """The bprof arm must really have profiled the window on every rank, or it measured nothing."""
    for rank in range(NPROC):
        trace = run_dir / "traces" / f"iteration_{plan.start}" / f"rank{rank}.json.gz"
        if not trace.exists():
            raise BenchmarkError(f"bprof record wrote no trace {trace}")
        meta = json.loads((run_dir / "meta" / f"rank{rank}.json").read_text())
        windows = [(w["window"], w["partial"]) for w in meta.get("windows_captured", [])]
        if windows != [(f"{plan.start}:{plan.end}", False)]:
            raise BenchmarkError(f"rank {rank}: bprof captured {windows}, expected one full window "
                                 f"{plan.start}:{plan.end} (notes: {meta.get('notes')})")


# ------------------------------------------------------------------------------------------------
# Per-pair measures and statistics


def job_step_ms(run: dict) -> list[float]:
    """The job's time per step: the slowest rank's step_ms."""
    return [max(col) for col in zip(*run["step_ms_by_rank"])]


def export_ms(run: dict, plan: Plan) -> float:
    return max(sum(ranks[s] for s in plan.export) for ranks in run["step_ms_by_rank"])


def pair_measures(plain: dict, bprof: dict, plan: Plan) -> dict:
    a, b = job_step_ms(plain), job_step_ms(bprof)
    out_a, out_b = (statistics.median(x[s] for s in plan.outside) for x in (a, b))
    in_a, in_b = (statistics.median(x[s] for s in plan.inside) for x in (a, b))
    # Start and export are measured against their own run's median outside step, then differenced
    # between the arms: a run that is slower throughout (other jobs' load) adds nothing to them.
    return {
        "plain_outside_median_ms": out_a,
        "bprof_outside_median_ms": out_b,
        "outside_ratio": out_b / out_a,
        "inside_ratio": in_b / in_a,
        "inside_vs_outside_ratio": (in_b / out_b) / (in_a / out_a),
        "start_extra_ms": (b[plan.start_step] - out_b) - (a[plan.start_step] - out_a),
        "export_extra_ms": ((export_ms(bprof, plan) - len(plan.export) * out_b)
                            - (export_ms(plain, plan) - len(plan.export) * out_a)),
        "wall_extra_s": bprof["wall_s"] - plain["wall_s"],
    }


def analyse(plan: Plan, runs: list[dict]) -> tuple[list[dict], dict]:
    """Per-pair measures (runs in the order they ran) and their means with confidence intervals."""
    pairs = []
    for pair in sorted({r["pair"] for r in runs}):
        arms = [r for r in runs if r["pair"] == pair]
        got = {r["arm"]: r for r in arms}
        pairs.append({"pair": pair, "first": arms[0]["arm"], **pair_measures(got["plain"], got["bprof"], plan)})
    keys = ("outside_ratio", "inside_ratio", "inside_vs_outside_ratio", "start_extra_ms", "export_extra_ms",
            "wall_extra_s")
    summary = {k: mean_ci([p[k] for p in pairs]) for k in keys}
    summary["verdict"] = verdict(summary["outside_ratio"])
    summary["pairs_for_1pct"] = pairs_for_half_width(summary["outside_ratio"]["sd"], GOAL_RATIO - 1)
    return pairs, summary


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (p > 0.5): bisection on the CDF, the density integrated by Simpson's rule."""
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def cdf(t: float, n: int = 2000) -> float:
        h = t / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[n] + 4 * sum(f[1:n:2]) + 2 * sum(f[2:n:2]))

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, hi * 2
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def mean_ci(values: list[float], level: float = 0.95) -> dict:
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "ci_low": None, "ci_high": None}
    sd = statistics.stdev(values)
    half = t_quantile(1 - (1 - level) / 2, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "ci_low": mean - half, "ci_high": mean + half}


def pairs_for_half_width(sd: float, half_width: float, level: float = 0.95) -> int:
    """The fewest pairs whose t interval is at most +-half_width at this spread."""
    p = 1 - (1 - level) / 2

    def enough(n: int) -> bool:
        return t_quantile(p, n - 1) * sd / math.sqrt(n) <= half_width

    n = max(2, math.ceil((1.96 * sd / half_width) ** 2))  # the normal interval's answer, a lower bound
    while not enough(n):
        n += 1
    return n


def verdict(outside: dict) -> str:
    lo, hi, mean = outside["ci_low"], outside["ci_high"], outside["mean"]
    if lo is None:
        return "not measurable: one pair gives no confidence interval"
    measured = f"{pct(mean)} (95% CI {pct(lo)} to {pct(hi)})"
    if lo <= 1.0 <= hi and hi <= GOAL_RATIO:
        return f"no measurable overhead outside the window: {measured}, within the 1% goal"
    if lo > 1.0:
        side = "within" if hi <= GOAL_RATIO else "not shown to be within"
        return f"measured overhead outside the window: {measured}, {side} the 1% goal"
    if hi < 1.0:
        return (f"bprof runs measured faster outside the window: {measured}; not an overhead, a difference "
                "between the arms that alternation did not cancel (rerun, more pairs)")
    return (f"overhead outside the window not resolved: {measured}; the interval reaches above the 1% goal, "
            "so this run cannot show it is met (more pairs or a quieter machine)")


def pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f}%"


# ------------------------------------------------------------------------------------------------
# Report


def fmt_ci(s: dict, unit: str = "", scale: float = 1.0, digits: int = 0, ratio: bool = False) -> str:
    if ratio:
        value = f"x{s['mean']:.4f}  ({pct(s['mean'])})"
        ci = "" if s["ci_low"] is None else f"  95% CI x{s['ci_low']:.4f} .. x{s['ci_high']:.4f}"
    else:
        value = f"{s['mean'] * scale:+.{digits}f} {unit}"
        ci = "" if s["ci_low"] is None else (f"  95% CI {s['ci_low'] * scale:+.{digits}f} .. "
                                             f"{s['ci_high'] * scale:+.{digits}f} {unit}")
    return value + ci


def steps_text(steps: list[int]) -> str:
    parts, i = [], 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        parts.append(str(steps[i]) if i == j else f"{steps[i]}-{steps[j]}")
        i = j + 1
    return ",".join(parts)


def report(plan: Plan, pairs: list[dict], summary: dict, runs: list[dict]) -> str:
    n = len(pairs)
    lines = [
        f"bprof record overhead: examples/train_gpt.py {' '.join(LAYOUT)}, {NPROC} CPU ranks (gloo, "
        f"OMP_NUM_THREADS=1), {plan.steps} steps, window {plan.start}:{plan.end}, {n} pairs, order alternated",
        "step time = slowest rank's step_ms (--log-json); ratio = bprof / plain, per pair, then mean over pairs",
        f"plain run, median outside step: {statistics.median(p['plain_outside_median_ms'] for p in pairs):.0f} ms "
        f"(per pair {min(p['plain_outside_median_ms'] for p in pairs):.0f} .. "
        f"{max(p['plain_outside_median_ms'] for p in pairs):.0f} ms)",
        "",
        f"  outside the window  steps {steps_text(plan.outside):<12} {fmt_ci(summary['outside_ratio'], ratio=True)}",
        f"  inside the window   steps {steps_text(plan.inside):<12} {fmt_ci(summary['inside_ratio'], ratio=True)}",
        f"    same, against each run's own outside steps     {fmt_ci(summary['inside_vs_outside_ratio'], ratio=True)}",
        f"  profiler start      step  {plan.start_step:<12} {fmt_ci(summary['start_extra_ms'], 'ms')}",
        f"  trace export        steps {steps_text(plan.export):<12} {fmt_ci(summary['export_extra_ms'], 'ms')}",
        f"  whole run (wall)                         {fmt_ci(summary['wall_extra_s'], 's', digits=1)}",
        "",
        f"verdict: {summary['verdict']}",
        f"spread: sd of the per-pair outside ratios {summary['outside_ratio']['sd']:.4f}; a +-1% interval at this "
        f"spread needs about {summary['pairs_for_1pct']} pairs",
        "",
        "per pair (first = arm run first):",
        "  pair first  outside   inside  in/out   start_ms  export_ms  wall_s  plain_outside_ms",
    ]
    for p in pairs:
        lines.append(f"  {p['pair']:>4} {p['first']:<6} {p['outside_ratio']:8.4f} {p['inside_ratio']:8.4f} "
                     f"{p['inside_vs_outside_ratio']:7.4f} "
                     f"{p['start_extra_ms']:+9.0f} {p['export_extra_ms']:+10.0f} {p['wall_extra_s']:+7.1f} "
                     f"{p['plain_outside_median_ms']:10.0f}")
    around = range(max(plan.warmup, plan.start - 2), min(plan.steps, plan.end + 2))
    lines += ["", "around the window, mean over pairs of the slowest rank's step_ms:",
              "  step  plain_ms  bprof_ms"]
    for s in around:
        mean = {arm: statistics.fmean(job_step_ms(r)[s] for r in runs if r["arm"] == arm) for arm in ("plain", "bprof")}
        lines.append(f"  {s:>4} {mean['plain']:9.0f} {mean['bprof']:9.0f}")
    return "\n".join(lines)


def environment() -> dict:
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    return {"git_sha": git("rev-parse", "HEAD"), "git_dirty": git("status", "--porcelain", "--", "bprof").splitlines(),
            "torch_version": metadata.version("torch"), "python": sys.version.split()[0],
            "num_cpus": os.cpu_count(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


# ------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=10, help="plain/bprof pairs (default 10)")
    parser.add_argument("--quick", action="store_true", help="3 pairs: a smoke run, too few to judge the goal")
    parser.add_argument("--steps", type=int, default=24, help="training steps per run (default 24)")
    parser.add_argument("--window", default="10:13", help="bprof record --steps window A:B (default 10:13)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps dropped (default 2)")
    parser.add_argument("--out", type=Path, default=DATA / "record-overhead.json", help="JSON results")
    parser.add_argument("--keep-runs", action="store_true", help="keep run directories (logs, traces)")
    parser.add_argument("--reanalyse", type=Path, metavar="FILE",
                        help="run nothing: recompute and print the report from the runs saved in FILE")
    args = parser.parse_args()
    if args.reanalyse:
        return reanalyse(args.reanalyse)
    try:
        plan = make_plan(args.steps, args.window, args.warmup)
        pairs_wanted = 3 if args.quick else args.pairs
        if pairs_wanted < 2:
            raise BenchmarkError("--pairs must be at least 2 (a confidence interval needs two)")
    except BenchmarkError as exc:
        print(f"record_overhead: {exc}", file=sys.stderr)
        return 2

    DATA.mkdir(exist_ok=True)
    workroot = Path(tempfile.mkdtemp(prefix="record-overhead-", dir=DATA))
    env = environment() | {"loadavg_start": os.getloadavg()}
    runs = []
    try:
        for i in range(pairs_wanted):
            order = ("plain", "bprof") if i % 2 == 0 else ("bprof", "plain")
            for arm in order:
                run = run_once(plan, arm, workroot / f"pair{i + 1}-{arm}")
                run |= {"pair": i + 1, "loadavg_after": os.getloadavg()}
                runs.append(run)
                print(f"[pair {i + 1}/{pairs_wanted}] {arm:5s} {run['wall_s']:5.1f} s, median outside step "
                      f"{statistics.median(job_step_ms(run)[s] for s in plan.outside):.0f} ms", file=sys.stderr)
    except BenchmarkError as exc:
        print(f"record_overhead: {exc}\nrun directories kept in {workroot}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nrecord_overhead: interrupted; run directories kept in {workroot}", file=sys.stderr)
        return 130

    pairs, summary = analyse(plan, runs)
    env["loadavg_end"] = os.getloadavg()
    result = {"benchmark": "record_overhead", "plan": plan.__dict__ | {"inside": plan.inside, "export": plan.export,
              "outside": plan.outside, "start_step": plan.start_step}, "layout": list(LAYOUT), "num_ranks": NPROC,
              "environment": env, "summary": summary, "pairs": pairs, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(report(plan, pairs, summary, runs))
    print(f"\nresults written to {args.out}")
    if args.keep_runs:
        print(f"run directories kept in {workroot}")
    else:
        shutil.rmtree(workroot)
    return 0


def reanalyse(path: Path) -> int:
    """Recompute pairs and summary from a results file's raw runs; rewrite them in the file."""
    result = json.loads(path.read_text())
    plan = Plan(**{k: result["plan"][k] for k in ("steps", "start", "end", "warmup")})
    result["pairs"], result["summary"] = analyse(plan, result["runs"])
    path.write_text(json.dumps(result, indent=1))
    print(report(plan, result["pairs"], result["summary"], result["runs"]))
    print(f"\nresults rewritten in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
