"""Per-rank reduce fanned out: N synthetic rank traces of realistic size reduced by the local pool
and by Ray (1 and 2 workers), against the local single-process baseline measured in the same run.

    .venv/bin/python benchmarks/scale_out.py                          # 4 traces of 128 MB of JSON
    .venv/bin/python benchmarks/scale_out.py --ranks 8 --trace-mb 256
    .venv/bin/python benchmarks/scale_out.py --modes local-1,ray-2    # a subset

The trace is bprof.synth's large writer (write_large_trace: rank 0 of a tp2·pp2·dp2 run, 8 layers,
its steps repeated to the size asked, gzip level 1), written once and hard-linked as N rank traces
(traces/r<i>/rank0.json.gz: each reduce reads a whole file; the outputs, all rank 0, stay apart).
Each mode runs in a child process of its own, so memory figures are its own, with its outputs
under a fresh --out folder (bprof.scale.fanout.reduce_paths, as `bprof reduce DIR --out` does):

  local-1   the baseline: one process, the traces one after the other, DuckDB on every core
  pool-2    --engine local --workers 2: two worker processes, one DuckDB thread each
  ray-1     --engine ray on a local Ray of 1 CPU (ray.init(num_cpus=1)), DuckDB on every core
  ray-2     --engine ray on a local Ray of 2 CPUs, one DuckDB thread per task

Printed per mode: the wall time of the reduces (Ray's start apart, given on its own), the speed-up
against local-1, the median seconds of one task in its worker, uncompressed JSON MB/s over the
whole run, and the largest peak RSS of any worker process (getrusage in the worker after each
task; DuckDB's memory included; for local-1 the process itself). Last, the per-rank cost on one
core (the median task of the mode that gives each task one core and one DuckDB thread) and the
projection to a cluster that follows from it, with its assumptions. Results: --json FILE.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = {  # name -> (engine, workers, DuckDB threads per reduce; None: one per core)
    "local-1": ("local", 1, None),
    "pool-2": ("local", 2, 1),
    "ray-1": ("ray", 1, None),
    "ray-2": ("ray", 2, 1),
}
ONE_CORE_MODES = ("ray-2", "pool-2")  # where each task has one core and one DuckDB thread


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--trace-mb", type=int, default=128, help="uncompressed JSON per rank trace, MB (2**20 bytes)")
    parser.add_argument("--dir", type=Path, default=ROOT / "bench-data" / "scale_out")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.dir)))
        return 0
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown mode(s) {unknown}; choose from {list(MODES)}")
    if "local-1" not in modes:
        modes.insert(0, "local-1")  # every ratio is against the baseline of the same run
    facts = prepare(args.dir, args.ranks, args.trace_mb << 20)
    print(f"{args.ranks} rank traces of {facts['json_bytes'] / 1e6:,.0f} MB of JSON ({facts['gzip_bytes'] / 1e6:,.1f} MB gzip, "
          f"{facts['events']:,} events) each; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    results = {}
    for mode in modes:
        done = subprocess.run([sys.executable, __file__, "--child", mode, "--dir", str(args.dir)],
                              capture_output=True, text=True, cwd=ROOT)
        if done.returncode != 0:
            print(f"{mode}: failed\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        results[mode]["load_after"] = os.getloadavg()[0]
    report(results, facts, args.ranks)
    if args.json:
        args.json.write_text(json.dumps({"trace": facts, "ranks": args.ranks, "cores": os.cpu_count(), "modes": results}, indent=1))
    return 0


def prepare(directory: Path, ranks: int, target_bytes: int) -> dict:
    """One large trace (kept between runs when its size is the one asked), linked as `ranks` traces."""
    from bprof.synth import write_large_trace

    source, facts_path = directory / "source" / "rank0.json.gz", directory / "source" / "facts.json"
    facts = json.loads(facts_path.read_text()) if facts_path.exists() else {}
    if facts.get("target_bytes") != target_bytes or not source.exists():
        source.parent.mkdir(parents=True, exist_ok=True)
        written = write_large_trace(source, target_bytes)
        facts = {"target_bytes": target_bytes, "json_bytes": written["json_bytes"], "events": written["events"],
                 "gzip_bytes": source.stat().st_size}
        facts_path.write_text(json.dumps(facts))
    shutil.rmtree(directory / "traces", ignore_errors=True)
    for i in range(ranks):
        link = directory / "traces" / f"r{i}" / "rank0.json.gz"
        link.parent.mkdir(parents=True)
        os.link(source, link)
    return facts


def child(mode: str, directory: Path) -> dict:
    """One mode, in this fresh process: the reduces of every trace into a fresh output folder."""
    import resource

    from bprof.scale.fanout import FanoutOptions, reduce_paths

    engine, workers, threads = MODES[mode]
    out = directory / f"out-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    init_s = 0.0
    if engine == "ray":
        import logging

        import ray

        started = time.perf_counter()
        ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        init_s = time.perf_counter() - started
    try:
        started = time.perf_counter()
        fanout = reduce_paths([str(directory / "traces")], FanoutOptions(engine=engine, workers=workers, threads=threads,
                                                                         out=str(out), force=True))
        wall_s = time.perf_counter() - started
    finally:
        if engine == "ray":
            ray.shutdown()
    failed = [o.error for o in fanout.failed]
    if failed:
        raise SystemExit("\n".join(failed))
    tasks = [{"seconds": o.result.seconds, "worker": o.result.worker, "peak_rss_bytes": o.result.peak_rss_bytes}
             for o in fanout.outcomes.values()]
    return {"engine": engine, "workers": workers, "threads": threads, "wall_s": wall_s, "init_s": init_s, "tasks": tasks,
            "driver_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "reduced_bytes": sum(f.stat().st_size for f in out.rglob("*") if f.is_file())}


def report(results: dict, facts: dict, ranks: int) -> None:
    base = results["local-1"]["wall_s"]
    json_mb = facts["json_bytes"] / 1e6
    print(f"\n{'mode':<8} {'wall s':>7} {'start s':>7} {'speed-up':>8} {'task s':>7} {'MB/s':>6} {'worker RSS MB':>13} {'load':>5}")
    for mode, r in results.items():
        peak = max(t["peak_rss_bytes"] for t in r["tasks"])
        task_s = statistics.median(t["seconds"] for t in r["tasks"])
        print(f"{mode:<8} {r['wall_s']:>7.1f} {r['init_s']:>7.1f} {base / r['wall_s']:>7.2f}x {task_s:>7.1f} "
              f"{ranks * json_mb / r['wall_s']:>6.1f} {peak / 2**20:>13,.0f} {r['load_after']:>5.1f}")
    one_core = next((m for m in ONE_CORE_MODES if m in results), None)
    if one_core is None:
        return
    cost = statistics.median(t["seconds"] for t in results[one_core]["tasks"])
    per_rank_kb = results[one_core]["reduced_bytes"] / ranks / 1e3
    print(f"\nper-rank cost: {cost:.1f} s on one core for {json_mb:,.0f} MB of JSON ({json_mb / cost:.1f} MB/s per core; "
          f"median task of {one_core}), {per_rank_kb:,.0f} kB of reduced output per rank")
    for n, cores in ((10_000, 1_000), (10_000, 10_000)):
        print(f"projection: {n:,} ranks of this size on {cores:,} cores: about {n * cost / cores / 60:,.1f} min "
              f"(ranks x cost / cores), {n * per_rank_kb / 1e6:,.1f} GB of outputs to ingest")
    print("  assumes each core reduces as fast as one here, storage that delivers cores x "
          f"{facts['gzip_bytes'] / 1e6 / cost:.1f} MB/s of gzip, and no cost per task beyond the task itself "
          "(measured: the ray-2/ray-1 and pool-2/local-1 speed-ups above)")


if __name__ == "__main__":
    sys.exit(main())
