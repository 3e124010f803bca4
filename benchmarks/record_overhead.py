"""What `bprof record` costs a training job: outside its step window (goal: at most 1 %) and inside.

    .venv/bin/python benchmarks/record_overhead.py            # 10 pairs, several minutes
    .venv/bin/python benchmarks/record_overhead.py --quick    # 3 pairs, a smoke run
    .venv/bin/python benchmarks/record_overhead.py --pairs 20 --steps 40 --window 15:18
    .venv/bin/python benchmarks/record_overhead.py --watch --pairs 6 --steps 60   # the --watch arm

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

The --watch arm. The same program plainly and under `bprof record --no-ingest --watch
--no-watch-trigger --steps <a window 1000 iterations past the run's end>`, so no trace window opens
and what is measured is the watch alone plus what `bprof record` costs outside a window (its
optimizer-step hook and the Flight Recorder it turns on: the default arm's "outside" line). The
baseline is plain torchrun, as above. The watch writes its rows every --watch-flush-every (10)
iterations or every 2 s, from inside the optimizer-step hook, so the flush lands inside
train_gpt.py's step_ms of one step in ten or so: the median step hides it and the mean does not.
Per pair: mean ratio = mean step (watch) / mean step (plain) over the steps after warm-up (the step
time being, as above, the slowest rank's step_ms, measured by the program, not by the watch);
median ratio likewise with medians (the per-iteration cost without the flushes). Each line gives
the mean over pairs and a Student's t 95 % interval. The watched run's own files are a cross-check:
every rank must have a row for every measured step, and the watch's mean step_ns (hook to hook) is
compared with the program's mean step_ms of the same rank. Before the pairs, a micro-benchmark in a
fresh interpreter times, in-process, WatchLog.boundary() per call, one flush() of 10 rows (the first
flush alone: it imports pyarrow) and a collective through the watch's wrapper against the raw call
(a 1-rank gloo group); `--watch-micro` runs only that.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
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
WATCH_WINDOW_PAST_END = 1000  # --watch arm: the --steps window starts this far past the run's last step


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
    bprof = str(Path(sys.executable).with_name("bprof"))
    if arm == "bprof":
        command = [bprof, "record", "--no-ingest", "--steps", f"{plan.start}:{plan.end}",
                   "--out", str(workdir / "run"), "--", *trainer]
    elif arm == "watch":
        far = plan.steps + WATCH_WINDOW_PAST_END
        command = [bprof, "record", "--no-ingest", "--watch", "--no-watch-trigger", "--steps", f"{far}:{far + 1}",
                   "--out", str(workdir / "run"), "--", *trainer]
    else:
        command = trainer
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_FR_BUFFER_SIZE", None)  # bprof sets it only where unset: the plain arm runs without
    output = workdir / "output.txt"
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    with output.open("w") as f:
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BenchmarkError(f"{arm} run did not finish in {RUN_TIMEOUT_S} s: {' '.join(command)}\n"
                                 f"output: {output}") from None
    wall_s = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # every process of the job, once reaped
    cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    if done.returncode != 0:
        tail = "\n".join(output.read_text(errors="replace").splitlines()[-30:])
        raise BenchmarkError(f"{arm} run exited with {done.returncode}: {' '.join(command)}\n"
                             f"last lines of its output ({output}):\n{tail}")
    step_ms = read_step_ms(workdir, plan.steps)
    run = {"arm": arm, "wall_s": wall_s, "cpu_s": cpu_s, "step_ms_by_rank": step_ms}
    if arm == "bprof":
        check_capture(workdir / "run", plan)
    if arm == "watch":
        run |= read_watch(workdir / "run", plan)
    return run


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


@dataclass(frozen=True)
class WatchPlan:
    """The --watch arm: no window; steps warmup..steps-1 are measured."""
    steps: int
    warmup: int

    @property
    def measured(self) -> list[int]:
        return list(range(self.warmup, self.steps))


def make_watch_plan(steps: int, warmup: int, flush_every: int = 10) -> WatchPlan:
    plan = WatchPlan(steps, warmup)
    if len(plan.measured) < 3 * flush_every:
        raise BenchmarkError(f"--watch: {len(plan.measured)} steps after warm-up hold fewer than 3 of the watch's "
                             f"flushes (every {flush_every} iterations); raise --steps")
    return plan


def read_watch(run_dir: Path, plan: WatchPlan) -> dict:
    """The watched run's own files: per rank, its step_ns by iteration and how many files it wrote.
    Every rank must have a row for every measured step, or the arm did not watch what it claims."""
    from bprof.watch import files

    folders = files.rank_folders(run_dir)
    if [f.rank for f in folders] != list(range(NPROC)):
        raise BenchmarkError(f"{run_dir}/watch: rank folders {[f.rank for f in folders]}, expected 0..{NPROC - 1}")
    if (run_dir / "traces").exists() and any((run_dir / "traces").iterdir()):
        raise BenchmarkError(f"{run_dir}/traces: the watched run opened a trace window; it must not")
    step_ns, num_files, flush_steps = [], [], []
    for folder in folders:
        paths = files.step_files(folder.path)
        by_iteration, flushed_in = {}, []
        for path in paths:
            columns, _ = files.read_steps(path)
            by_iteration.update(zip(columns["iteration"], columns["step_ns"]))
            # the rows up to iteration k are written by the hook that ends step k: inside its step_ms
            flushed_in.append(max(columns["iteration"]))
        missing = [s for s in plan.measured if s not in by_iteration]
        if missing:
            raise BenchmarkError(f"{folder.path}: no watch row for iterations {steps_text(missing)}")
        step_ns.append({str(k): v for k, v in sorted(by_iteration.items())})
        num_files.append(len(paths))
        flush_steps.append(flushed_in)
    return {"watch_step_ns_by_rank": step_ns, "watch_num_step_files_by_rank": num_files,
            "watch_flush_steps_by_rank": flush_steps}


def watch_pair_measures(plain: dict, watch: dict, plan: WatchPlan) -> dict:
    a, b = ([job_step_ms(r)[s] for s in plan.measured] for r in (plain, watch))
    # the first flush imports pyarrow on every rank: a one-off, measured apart (like the export above)
    first = sorted({steps[0] for steps in watch["watch_flush_steps_by_rank"] if steps[0] in plan.measured})
    rest = [i for i, s in enumerate(plan.measured) if s not in first]
    med_a, med_b = statistics.median(a), statistics.median(b)
    at = [plan.measured.index(s) for s in first]
    # cross-check: the watch's own step (hook to hook) against the program's step_ms, rank by rank
    own = [statistics.fmean(ns[str(s)] for s in plan.measured) / 1e6
           / statistics.fmean(ms[s] for s in plan.measured)
           for ns, ms in zip(watch["watch_step_ns_by_rank"], watch["step_ms_by_rank"])]
    return {
        "plain_mean_ms": statistics.fmean(a),
        "watch_mean_ms": statistics.fmean(b),
        "mean_ratio": statistics.fmean(b) / statistics.fmean(a),
        "median_ratio": med_b / med_a,
        "steady_mean_ratio": statistics.fmean(b[i] for i in rest) / statistics.fmean(a[i] for i in rest),
        "first_flush_steps": first,
        "first_flush_extra_ms": sum(b[i] - med_b for i in at) - sum(a[i] - med_a for i in at),
        "wall_extra_s": watch["wall_s"] - plain["wall_s"],
        "cpu_extra_s": watch["cpu_s"] - plain["cpu_s"],
        "watch_vs_program_step": statistics.fmean(own),
        "num_step_files": min(watch["watch_num_step_files_by_rank"]),
    }


def analyse_watch(plan: WatchPlan, runs: list[dict]) -> tuple[list[dict], dict]:
    pairs = []
    for pair in sorted({r["pair"] for r in runs}):
        arms = [r for r in runs if r["pair"] == pair]
        got = {r["arm"]: r for r in arms}
        pairs.append({"pair": pair, "first": arms[0]["arm"], **watch_pair_measures(got["plain"], got["watch"], plan)})
    summary = {k: mean_ci([p[k] for p in pairs]) for k in (
        "mean_ratio", "median_ratio", "steady_mean_ratio", "first_flush_extra_ms", "wall_extra_s", "cpu_extra_s",
        "watch_vs_program_step")}
    summary["verdict"] = verdict(summary["mean_ratio"]).replace("outside the window", "under --watch")
    summary["pairs_for_1pct"] = pairs_for_half_width(summary["mean_ratio"]["sd"], GOAL_RATIO - 1)
    return pairs, summary


def report_watch(plan: WatchPlan, pairs: list[dict], summary: dict, micro: dict | None) -> str:
    n = len(pairs)
    lines = [
        f"bprof record --watch overhead: examples/train_gpt.py {' '.join(LAYOUT)}, {NPROC} CPU ranks (gloo, "
        f"OMP_NUM_THREADS=1), {plan.steps} steps ({steps_text(plan.measured)} measured), no trace window, "
        f"{n} pairs, order alternated",
        "step time = slowest rank's step_ms (the program's --log-json); ratio = watch / plain torchrun, per pair, "
        "then mean over pairs",
        f"plain run, mean step: {statistics.median(p['plain_mean_ms'] for p in pairs):.0f} ms (per pair "
        f"{min(p['plain_mean_ms'] for p in pairs):.0f} .. {max(p['plain_mean_ms'] for p in pairs):.0f} ms); "
        f"watch files per rank and run: {min(p['num_step_files'] for p in pairs)}"
        f"..{max(p['num_step_files'] for p in pairs)}",
        "",
        f"  mean step   (flushes included)  {fmt_ci(summary['mean_ratio'], ratio=True)}",
        f"  median step (flushes hidden)    {fmt_ci(summary['median_ratio'], ratio=True)}",
        f"  mean step, first flush's step left out  {fmt_ci(summary['steady_mean_ratio'], ratio=True)}",
        f"  first flush (imports pyarrow), extra    {fmt_ci(summary['first_flush_extra_ms'], 'ms')}",
        f"  whole run (wall)                {fmt_ci(summary['wall_extra_s'], 's', digits=1)}",
        f"  whole run, CPU of every process {fmt_ci(summary['cpu_extra_s'], 's', digits=1)}",
        f"  cross-check: watch step_ns / program step_ms, watched run  {fmt_ci(summary['watch_vs_program_step'], ratio=True)}",
        "",
        f"verdict: {summary['verdict']}",
        f"spread: sd of the per-pair mean ratios {summary['mean_ratio']['sd']:.4f}; a +-1% interval at this "
        f"spread needs about {summary['pairs_for_1pct']} pairs",
        "",
        "per pair (first = arm run first):",
        "  pair first  mean_ratio  median_ratio  steady_ratio  first_flush_ms  wall_s  cpu_s  plain_mean_ms  "
        "watch/program",
    ]
    for p in pairs:
        lines.append(f"  {p['pair']:>4} {p['first']:<6} {p['mean_ratio']:10.4f} {p['median_ratio']:13.4f} "
                     f"{p['steady_mean_ratio']:13.4f} {p['first_flush_extra_ms']:+15.0f} {p['wall_extra_s']:+7.1f} "
                     f"{p['cpu_extra_s']:+6.1f} {p['plain_mean_ms']:14.0f} {p['watch_vs_program_step']:14.4f}")
    if micro:
        lines += ["", micro_text(micro)]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# --watch micro-benchmark, in-process (run in a fresh interpreter, so that the first flush imports pyarrow)


def watch_micro(num_boundaries: int = 20000, num_flushes: int = 200, num_calls: int = 10000) -> dict:
    import gc

    first_imported = "pyarrow" in sys.modules
    import torch
    import torch.distributed as dist

    from bprof.profiler.watch_rank import WatchLog

    with tempfile.TemporaryDirectory(prefix="watch-micro-", dir=DATA) as tmp:
        groups = (("0", "default_pg"), ("1", "tp"))
        # boundary(): 2 process groups with blocked time in every row, as train_gpt's tp ranks have
        log = WatchLog(Path(tmp) / "b", 0, "host", flush_every=10**9, flush_s=1e9)
        boundary_ns = []
        gc.disable()
        for i in range(num_boundaries):
            for g in groups:
                log.add_blocked(g, 1000)
            t0 = time.perf_counter_ns()
            log.boundary(i, False)
            boundary_ns.append(time.perf_counter_ns() - t0)
        t0 = time.perf_counter_ns()
        for i in range(num_boundaries):
            log.add_blocked(groups[0], 1000)
        add_blocked_ns = (time.perf_counter_ns() - t0) / num_boundaries
        gc.enable()

        # flush() of 10 rows (and their 20 group rows: two files)
        log = WatchLog(Path(tmp) / "f", 0, "host", flush_every=10**9, flush_s=1e9)
        flush_ns = []
        for k in range(num_flushes + 1):
            for i in range(10):
                for g in groups:
                    log.add_blocked(g, 1000)
                log.boundary(k * 10 + i + 1, False)
            t0 = time.perf_counter_ns()
            log.flush()
            flush_ns.append(time.perf_counter_ns() - t0)
        num_files = len(list(log.folder.iterdir()))

        # a collective through the watch's wrapper against the raw call: 1-rank gloo group
        # A synchronous all_reduce calls Work.wait() itself, so the watch's wrapper of Work.wait (a class
        # attribute) is on its path too: "raw" puts torch's own wait back for its blocks.
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        work_class = dist.distributed_c10d.Work
        raw, raw_wait = dist.all_reduce, work_class.wait
        WatchLog(Path(tmp) / "c", 0, "host").install()
        wrapped, wrapped_wait = dist.all_reduce, work_class.wait
        if wrapped is raw or wrapped_wait is raw_wait:
            raise BenchmarkError("WatchLog.install() did not wrap torch.distributed.all_reduce and Work.wait")
        x = torch.zeros(1)
        per_call = {"raw": [], "wrapped": []}
        arms = {"raw": (raw, raw_wait), "wrapped": (wrapped, wrapped_wait)}
        for block in range(20):  # interleaved blocks
            for name in ("raw", "wrapped") if block % 2 == 0 else ("wrapped", "raw"):
                fn, work_class.wait = arms[name]
                t0 = time.perf_counter_ns()
                for _ in range(num_calls // 20):
                    fn(x)
                per_call[name].append((time.perf_counter_ns() - t0) / (num_calls // 20))
        work_class.wait = wrapped_wait

        # a DDP module's backward (its reducer's one bucket all-reduced in the 1-rank group) through the
        # watch's wrapper of torch.autograd.backward against the raw function
        from bprof.profiler.watch_rank import watch_ddp_modules

        watch_ddp_modules()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
        inputs = torch.randn(4, 16)
        wrapped_backward = torch.autograd.backward
        raw_backward = getattr(wrapped_backward, "__wrapped__", None)
        if raw_backward is None:
            raise BenchmarkError("WatchLog.install() did not wrap torch.autograd.backward")
        per_backward = {"raw": [], "wrapped": []}
        for block in range(20):
            for name in ("raw", "wrapped") if block % 2 == 0 else ("wrapped", "raw"):
                torch.autograd.backward = raw_backward if name == "raw" else wrapped_backward
                t0 = time.perf_counter_ns()
                for _ in range(num_calls // 40):
                    model(inputs).sum().backward()
                per_backward[name].append((time.perf_counter_ns() - t0) / (num_calls // 40))
        torch.autograd.backward = wrapped_backward
        dist.destroy_process_group()

    q = statistics.quantiles
    return {"pyarrow_imported_before_first_flush": first_imported,
            "boundary_median_us": statistics.median(boundary_ns) / 1e3,
            "boundary_p99_us": q(boundary_ns, n=100)[98] / 1e3,
            "add_blocked_us": add_blocked_ns / 1e3,
            "first_flush_ms": flush_ns[0] / 1e6,
            "flush_median_ms": statistics.median(flush_ns[1:]) / 1e6,
            "flush_p90_ms": q(flush_ns[1:], n=10)[8] / 1e6,
            "flush_files_written": num_files,
            "all_reduce_raw_us": statistics.median(per_call["raw"]) / 1e3,
            "all_reduce_wrapped_us": statistics.median(per_call["wrapped"]) / 1e3,
            "ddp_step_raw_us": statistics.median(per_backward["raw"]) / 1e3,
            "ddp_step_wrapped_us": statistics.median(per_backward["wrapped"]) / 1e3,
            "num_boundaries": num_boundaries, "num_flushes": num_flushes, "num_calls": num_calls}


def run_watch_micro() -> dict:
    """watch_micro() in a fresh interpreter (nothing imported before it but this script)."""
    done = subprocess.run([sys.executable, __file__, "--watch-micro-json"], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=RUN_TIMEOUT_S)
    if done.returncode != 0:
        raise BenchmarkError(f"the --watch micro-benchmark failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.splitlines()[-1])


def micro_text(m: dict) -> str:
    extra = m["all_reduce_wrapped_us"] - m["all_reduce_raw_us"]
    return "\n".join([
        "in-process, one rank (micro-benchmark):",
        f"  WatchLog.boundary()          {m['boundary_median_us']:7.1f} us median, p99 {m['boundary_p99_us']:.1f} us "
        f"(n={m['num_boundaries']}, 2 groups per row)",
        f"  WatchLog.add_blocked()       {m['add_blocked_us']:7.2f} us",
        f"  first flush() of 10 rows     {m['first_flush_ms']:7.1f} ms (imports pyarrow"
        f"{'; it was already imported' if m['pyarrow_imported_before_first_flush'] else ''})",
        f"  flush() of 10 rows           {m['flush_median_ms']:7.2f} ms median, p90 {m['flush_p90_ms']:.2f} ms "
        f"(n={m['num_flushes']}; steps + groups file each)",
        f"  all_reduce(1 float), 1 rank  {m['all_reduce_raw_us']:7.1f} us raw, {m['all_reduce_wrapped_us']:.1f} us "
        f"wrapped ({extra:+.1f} us a call: the collective's wrapper and Work.wait's, both on a synchronous call)",
        *([f"  DDP forward+backward, 1 rank  {m['ddp_step_raw_us']:7.1f} us raw, {m['ddp_step_wrapped_us']:.1f} us "
           f"wrapped ({m['ddp_step_wrapped_us'] - m['ddp_step_raw_us']:+.1f} us: torch.autograd.backward's wrapper, "
           "which times DDP's reducer wait)"] if "ddp_step_raw_us" in m else []),
    ])


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
    parser.add_argument("--steps", type=int, default=None,
                        help="training steps per run (default 24; with --watch 60)")
    parser.add_argument("--window", default="10:13", help="bprof record --steps window A:B (default 10:13)")
    parser.add_argument("--warmup", type=int, default=2, help="first steps dropped (default 2)")
    parser.add_argument("--watch", action="store_true",
                        help="the --watch arm: plain against `bprof record --watch` with no window")
    parser.add_argument("--watch-micro", action="store_true",
                        help="only the --watch micro-benchmark (boundary, flush, collective wrapper)")
    parser.add_argument("--watch-micro-json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON results (default bench-data/record-overhead.json; with --watch "
                             "bench-data/record-overhead-watch.json)")
    parser.add_argument("--keep-runs", action="store_true", help="keep run directories (logs, traces)")
    parser.add_argument("--reanalyse", type=Path, metavar="FILE",
                        help="run nothing: recompute and print the report from the runs saved in FILE")
    args = parser.parse_args()
    if args.reanalyse:
        return reanalyse(args.reanalyse)
    if args.watch_micro_json:
        DATA.mkdir(exist_ok=True)
        print(json.dumps(watch_micro()))
        return 0
    if args.watch_micro:
        DATA.mkdir(exist_ok=True)
        try:
            print(micro_text(run_watch_micro()))
        except BenchmarkError as exc:
            print(f"record_overhead: {exc}", file=sys.stderr)
            return 1
        return 0
    arms = ("plain", "watch") if args.watch else ("plain", "bprof")
    out = args.out or DATA / ("record-overhead-watch.json" if args.watch else "record-overhead.json")
    try:
        if args.watch:
            plan = make_watch_plan(args.steps or 60, args.warmup)
        else:
            plan = make_plan(args.steps or 24, args.window, args.warmup)
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
    micro = None
    try:
        if args.watch:
            micro = run_watch_micro()
            print(micro_text(micro), file=sys.stderr)
        for i in range(pairs_wanted):
            order = arms if i % 2 == 0 else arms[::-1]
            for arm in order:
                run = run_once(plan, arm, workroot / f"pair{i + 1}-{arm}")
                run |= {"pair": i + 1, "loadavg_after": os.getloadavg()}
                runs.append(run)
                steps = plan.measured if args.watch else plan.outside
                what = "mean step" if args.watch else "median outside step"
                value = (statistics.fmean if args.watch else statistics.median)(job_step_ms(run)[s] for s in steps)
                print(f"[pair {i + 1}/{pairs_wanted}] {arm:5s} {run['wall_s']:5.1f} s, {what} {value:.0f} ms, "
                      f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    except BenchmarkError as exc:
        print(f"record_overhead: {exc}\nrun directories kept in {workroot}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nrecord_overhead: interrupted; run directories kept in {workroot}", file=sys.stderr)
        return 130

    env["loadavg_end"] = os.getloadavg()
    if args.watch:
        pairs, summary = analyse_watch(plan, runs)
        result = {"benchmark": "record_overhead --watch", "plan": plan.__dict__ | {"measured": plan.measured},
                  "layout": list(LAYOUT), "num_ranks": NPROC, "environment": env, "micro": micro,
                  "summary": summary, "pairs": pairs, "runs": runs}
        text = report_watch(plan, pairs, summary, micro)
    else:
        pairs, summary = analyse(plan, runs)
        result = {"benchmark": "record_overhead", "plan": plan.__dict__ | {"inside": plan.inside, "export": plan.export,
                  "outside": plan.outside, "start_step": plan.start_step}, "layout": list(LAYOUT), "num_ranks": NPROC,
                  "environment": env, "summary": summary, "pairs": pairs, "runs": runs}
        text = report(plan, pairs, summary, runs)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(text)
    print(f"\nloadavg: start {env['loadavg_start'][0]:.1f}, end {env['loadavg_end'][0]:.1f}; results written to {out}")
    if args.keep_runs:
        print(f"run directories kept in {workroot}")
    else:
        shutil.rmtree(workroot)
    return 0


def reanalyse(path: Path) -> int:
    """Recompute pairs and summary from a results file's raw runs; rewrite them in the file."""
    result = json.loads(path.read_text())
    if result.get("benchmark") == "record_overhead --watch":
        plan = WatchPlan(**{k: result["plan"][k] for k in ("steps", "warmup")})
        result["pairs"], result["summary"] = analyse_watch(plan, result["runs"])
        text = report_watch(plan, result["pairs"], result["summary"], result.get("micro"))
    else:
        plan = Plan(**{k: result["plan"][k] for k in ("steps", "start", "end", "warmup")})
        result["pairs"], result["summary"] = analyse(plan, result["runs"])
        text = report(plan, result["pairs"], result["summary"], result["runs"])
    path.write_text(json.dumps(result, indent=1))
    print(text)
    print(f"\nresults rewritten in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
