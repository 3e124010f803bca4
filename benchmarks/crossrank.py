"""Cross-rank analysis at fleet scale: matching, clock alignment, collective performance, bubbles
and stragglers on a TP8 x PP8 x DP(N/64) job of 1,024 and 10,240 ranks.

    .venv/bin/python benchmarks/crossrank.py                  # 1,024 and 10,240 ranks
    .venv/bin/python benchmarks/crossrank.py --ranks 1024     # one size
    .venv/bin/python benchmarks/crossrank.py --dir bench-data/crossrank --keep   # keep the stores

Each size is a bprof.synth.fleet run (16 micro-batches of 1F1B, 2 recorded steps, 42 TP
all-reduces per forward chunk and 84 per backward, 40 DP reduce-scatters per step, 8 ranks per
host with random host clock offsets of up to +-2 ms, rank 333 (mod the world size) computing 1.3x
slower) written
straight into a store as the compact per-rank tables `bprof reduce` ships. The store is generated
in one child process and analysed in a fresh one, so each peak RSS is its own: the analysis runs
the analyzers cross-rank analysis needs, in `bprof analyze`'s order and in one transaction, with
DuckDB's memory limit at --memory-limit (default 4GB, as `bprof analyze --memory-limit 4GB`):
timeline and breakdown (which copy the reduced ranks' spans and partition, and split exposed
communication by parallel dimension), match, clock, collperf, bubbles and stragglers.

Printed per size: collective rows (total, and per rank per step), seconds per analyzer and in
all, the analysis process's peak RSS, and checks against the truth: the top straggler and its
cost against the re-simulation without the slow rank, the worst clock offset error. Last, how
cost grows: the time and memory ratio of each size against the smallest, next to the rows ratio
(linear growth keeps them equal). Goal (issue 6): 10,240 ranks within 60 s and 8 GB here.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SLOW_RANK, SLOW_FACTOR = 333, 1.3
ANALYZERS = ["timeline", "match", "clock", "collperf", "breakdown", "bubbles", "stragglers"]
# what issue 6's time goal names: matching, alignment, straggler and bubble analysis, with collperf,
# whose instances the stragglers read (timeline and breakdown are per-rank analysis)
GOAL = ["match", "clock", "collperf", "bubbles", "stragglers"]


def fleet_for(ranks: int):
    from bprof.synth.fleet import Fleet
    if ranks % 64:
        raise SystemExit(f"--ranks {ranks}: must be a multiple of 64 (TP8 x PP8 x DP)")
    return Fleet(tp=8, pp=8, dp=ranks // 64, slow_rank=SLOW_RANK % ranks, slow_factor=SLOW_FACTOR)


def child_generate(ranks: int, path: Path) -> dict:
    import resource

    from bprof.store.db import open_store
    from bprof.synth.fleet import write_fleet
    path.unlink(missing_ok=True)
    con = open_store(path)
    t0 = time.perf_counter()
    truth = write_fleet(con, fleet_for(ranks))
    con.close()
    return {"seconds": time.perf_counter() - t0, "parts": truth.seconds, "rows": truth.num_collective_rows,
            "rows_per_rank_step": truth.rows_per_rank_step, "lost_ns": truth.lost_ns, "step_ns": truth.step_ns,
            "offsets": {f"node{h}": -int(o) for h, o in enumerate(truth.host_offset_ns.tolist())},
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def child_analyze(path: Path, run_id: int, memory_limit: str) -> dict:
    import importlib
    import resource

    from bprof.analyzers.base import Options, replace_rows, write_findings
    from bprof.store.db import open_store
    from bprof.store.limits import set_memory_limit
    con = open_store(path)
    set_memory_limit(con, memory_limit)
    seconds, cpu_seconds = {}, {}
    con.execute("BEGIN TRANSACTION")
    for name in ANALYZERS:
        module = importlib.import_module(f"bprof.analyzers.{name}")
        t0, cpu0 = time.perf_counter(), _cpu_seconds()
        replace_rows(con, module.TABLES, run_id)
        result = module.analyze(con, run_id, Options())
        write_findings(con, run_id, module.NAME, result.findings)
        seconds[name], cpu_seconds[name] = time.perf_counter() - t0, _cpu_seconds() - cpu0
        # CPU seconds (user + system, every thread) move less than wall seconds when the cores are shared
        print(f"    {name} {seconds[name]:.1f} s ({cpu_seconds[name]:.1f} CPU s), peak RSS so far "
              f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB, load average "
              f"{open('/proc/loadavg').read().split()[0]}", file=sys.stderr, flush=True)
    con.execute("COMMIT")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    top = con.execute("""SELECT lost_ns, evidence->>'$.ranks' FROM findings
                         WHERE run_id = ? AND analyzer = 'stragglers' ORDER BY lost_ns DESC LIMIT 1""", [run_id]).fetchone()
    offsets = dict(con.execute("SELECT host, offset_ns FROM clock_hosts WHERE run_id = ?", [run_id]).fetchall())
    instances = con.execute("SELECT status, count(*) FROM match_instances WHERE run_id = ? GROUP BY ALL", [run_id]).fetchall()
    bubbles = con.execute("SELECT bubble_frac_measured, bubble_frac_theory FROM bubbles_runs WHERE run_id = ?", [run_id]).fetchone()
    con.close()
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_rss_bytes": rss, "top_straggler": top and {"lost_ns": top[0], "ranks": json.loads(top[1])},
            "offsets": offsets, "instances": dict(instances), "bubbles": bubbles}


def _cpu_seconds() -> float:
    import resource
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_child(*args: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"child {args} failed (exit {done.returncode}; its stderr is above)")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="1024,10240", help="comma-separated world sizes (multiples of 64)")
    p.add_argument("--dir", type=Path, default=None, help="where the stores go (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the stores")
    p.add_argument("--memory-limit", default="4GB", help="DuckDB's memory limit in the analysis (bprof analyze --memory-limit)")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kind, *rest = args.child
        out = (child_generate(int(rest[0]), Path(rest[1])) if kind == "generate"
               else child_analyze(Path(rest[0]), int(rest[1]), rest[2]))
        print(json.dumps(out))
        return
    base = args.dir or Path(tempfile.mkdtemp(prefix="crossrank-", dir=ROOT / "bench-data" if (ROOT / "bench-data").exists() else None))
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for ranks in [int(r) for r in args.ranks.split(",")]:
            path = base / f"fleet{ranks}.duckdb"
            gen = run_child("generate", str(ranks), str(path))
            print(f"{ranks:,} ranks: {gen['rows']:,} collective rows ({gen['rows_per_rank_step']['min']:,}-"
                  f"{gen['rows_per_rank_step']['max']:,} per rank per step), generated in {gen['seconds']:.0f} s", flush=True)
            an = run_child("analyze", str(path), "1", args.memory_limit)
            total = sum(an["seconds"].values())
            top = an["top_straggler"]
            errors = [abs(an["offsets"][h] - o) for h, o in gen["offsets"].items() if h in an["offsets"]]
            print(f"  analysis {total:.1f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in an["seconds"].items())
                  + f"), peak RSS {an['peak_rss_bytes'] / 2**30:.2f} GiB")
            print("  CPU seconds " + ", ".join(f"{k} {v:.1f}" for k, v in an["cpu_seconds"].items()))
            goal = [k for k in GOAL if k in an["seconds"]]
            print(f"  the goal's part ({', '.join(goal)}): {sum(an['seconds'][k] for k in goal):.1f} s, "
                  f"{sum(an['cpu_seconds'][k] for k in goal):.1f} CPU s (issue 6: <= 60 s at 10,240 ranks)")
            print(f"  instances {an['instances']}; bubbles measured/theory {an['bubbles']}")
            print(f"  top straggler {top and top['ranks']} lost {top and top['lost_ns'] / 1e6:.2f} ms "
                  f"(truth: rank {SLOW_RANK % ranks}, {gen['lost_ns'] / 1e6:.2f} ms); clock offsets: {len(errors)} hosts, "
                  f"worst error {max(errors) / 1e3:.1f} us", flush=True)
            rows.append((ranks, gen["rows"], total, an["peak_rss_bytes"]))
            if not args.keep:
                path.unlink(missing_ok=True)
        if len(rows) > 1:
            r0 = rows[0]
            print("\nranks    rows ratio  time ratio  RSS ratio")
            for ranks, n, total, rss in rows:
                print(f"{ranks:>6,} {n / r0[1]:>11.1f} {total / r0[2]:>11.1f} {rss / r0[3]:>10.1f}")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
