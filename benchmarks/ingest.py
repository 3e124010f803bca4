"""Ingest throughput and peak memory, against HolisticTraceAnalysis 0.5.0 and the practical limits.

    .venv/bin/python benchmarks/ingest.py            # everything, the 2 GB memory check included
    .venv/bin/python benchmarks/ingest.py --quick    # skip the 2 GB trace

For each input (the real fixtures of ../shared/traces when present, a synthetic 8-rank NCCL run,
and a real 4-rank recording of examples/train_gpt.py when runs/demo/traces exists) it measures,
each in a fresh process so that peak RSS is that tool's alone:
  bprof      `ingest_paths` into a new DuckDB file (gzip inflation included)
  hta        HolisticTraceAnalysis 0.5.0 `TraceAnalysis(trace_dir=...)` (its own venv, made on
             first use under bench-data/hta-venv with `pip install HolisticTraceAnalysis==0.5.0`)
  orjson     gzip inflation + orjson.loads of every file (a parser building Python objects)
  duckdb     DuckDB's native read_json scan of the already inflated events arrays (a ceiling)
and prints MB/s of uncompressed trace JSON and peak RSS, and the ratios measured in this same run
(the machine is shared and noisy: compare ratios, not absolute times). Each tool runs `--repeat`
times; the best time counts.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench-data"
SHARED = ROOT.parent / "shared" / "traces"
HTA_VENV = DATA / "hta-venv"

# Runs inside a fresh interpreter: one tool, one input; prints wall, cpu, maxrss as JSON.
_MEASURE = r"""
import json, os, resource, sys, time, tempfile
from pathlib import Path
tool, paths = sys.argv[1], [Path(p) for p in sys.argv[2:]]
files = [p for d in paths for p in (sorted(x for x in d.rglob('*') if x.name.endswith(('.json', '.json.gz')) and x.name != 'truth.json') if d.is_dir() else [d])]
t0 = time.perf_counter()
if tool == 'bprof':
    from bprof.store.db import open_store
    from bprof.store.ingest import IngestOptions, ingest_paths
    with tempfile.TemporaryDirectory(dir=os.environ.get('BENCH_TMP')) as tmp:
        con = open_store(Path(tmp) / 'b.duckdb')
        rank = 0 if len(files) == 1 else None
        [r] = ingest_paths(con, paths, IngestOptions(rank=rank))
        con.close()
        nbytes = r.uncompressed_bytes
elif tool == 'hta':
    import logging
    logging.disable(logging.CRITICAL)
    from hta.trace_analysis import TraceAnalysis
    ta = TraceAnalysis(trace_dir=str(paths[0]))
    nbytes = None
    loaded = len(ta.t.traces)
    if loaded != len(files):
        sys.exit(f'HTA loaded {loaded} of {len(files)} rank traces')
elif tool == 'orjson':
    import gzip, orjson
    nbytes = 0
    for f in files:
        raw = gzip.open(f).read() if f.name.endswith('.gz') else f.read_bytes()
        nbytes += len(raw)
        orjson.loads(raw)
        del raw
elif tool == 'duckdb':
    import duckdb
    arrays = [str(p) for p in paths]
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    con.execute(
        "SELECT count(*), sum(length(args)) FROM read_json(?, format='array', columns={ph:'VARCHAR', cat:'VARCHAR', "
        "name:'VARCHAR', pid:'VARCHAR', tid:'VARCHAR', ts:'DECIMAL(22,3)', dur:'DECIMAL(22,3)', id:'VARCHAR', args:'JSON'})",
        [arrays]).fetchall()
    nbytes = sum(p.stat().st_size for p in paths)
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({'wall_s': wall, 'cpu_s': ru.ru_utime + ru.ru_stime + kids.ru_utime + kids.ru_stime,
                  'maxrss_mb': max(ru.ru_maxrss, kids.ru_maxrss) / 1024, 'bytes': nbytes}))
"""


def measure(python: str, tool: str, paths: list[Path], repeat: int) -> dict | None:
    best = None
    for _ in range(repeat):
        done = subprocess.run([python, "-c", _MEASURE, tool, *map(str, paths)], capture_output=True, text=True,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=3600)
        if done.returncode != 0:
            print(f"  {tool}: failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
            return None
        result = json.loads(done.stdout.strip().splitlines()[-1])
        if best is None or result["wall_s"] < best["wall_s"]:
            best = result | {"maxrss_mb": max(result["maxrss_mb"], (best or {}).get("maxrss_mb", 0))}
    return best


def hta_python() -> str | None:
    python = HTA_VENV / "bin" / "python"
    if not python.exists():
        print("creating bench-data/hta-venv with HolisticTraceAnalysis 0.5.0 ...")
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "HolisticTraceAnalysis==0.5.0"])
        if done.returncode != 0:
            return None
    return str(python)


def split_arrays(paths: list[Path], out: Path) -> list[Path]:
    from bprof.store.discover import discover
    from bprof.store.kineto_file import split_trace

    arrays = []
    for run in discover(paths):
        for i, f in enumerate(run.files):
            arrays.extend(split_trace(f, out / f"{len(arrays)}-{i}.json").array_paths)
    return arrays


def inputs(quick: bool) -> list[tuple[str, list[Path], bool]]:
    """(label, paths, what HTA loads): HTA needs a plain directory of rank traces (True: paths[0])."""
    found = []
    if SHARED.exists():
        for name in ("a100_ddp_nccl_rank0", "a100_ws16_rank0", "v100_ns_resolution_rank0", "v100_resnet50_legacy_2021"):
            found.append((f"real {name}", [SHARED / name], True))
    synthetic = DATA / "synthetic-8rank"
    if not (synthetic / "rank7.json.gz").exists():
        from bprof.synth import Scenario, write_run

        # pretty-printed like torch's own writer: HTA finds ranks only as `"rank": N`; truth.json
        # moves out of the folder because HTA would take it for a trace
        write_run(Scenario(tp=2, pp=2, dp=2, steps=4, hosts=2, events_scale=2.0, seed=1), synthetic, pretty=True)
        (synthetic / "truth.json").rename(DATA / "synthetic-8rank.truth.json")
    found.append(("synthetic 8 ranks (tp2 pp2 dp2)", [synthetic], True))
    demo = ROOT / "runs" / "demo" / "record"  # written by `make demo` (bprof record of train_gpt)
    if demo.exists():
        found.append(("recorded 4 ranks (train_gpt tp2 dp2, gloo)", [demo], next((demo / "traces").iterdir())))
    if not quick:
        large = DATA / "large-2GB" / "rank0.json"
        if not large.exists():
            from bprof.synth.large import write_large_trace

            large.parent.mkdir(parents=True, exist_ok=True)
            print("writing a 2 GB synthetic trace (once) ...")
            write_large_trace(large, 2 * 1024**3)
        found.append(("synthetic single trace, 2 GB", [large.parent], False))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip the 2 GB memory check")
    parser.add_argument("--repeat", type=int, default=2, help="runs per tool and input; the best counts")
    parser.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
    parser.add_argument("--only", default="", help="run only the inputs whose label contains this text")
    args = parser.parse_args()
    DATA.mkdir(exist_ok=True)
    hta = None if args.no_hta else hta_python()
    rows = []
    for label, paths, hta_input in inputs(args.quick):
        if args.only not in label:
            continue
        print(f"\n== {label}")
        with tempfile.TemporaryDirectory(dir=DATA) as tmp:
            arrays = split_arrays(paths, Path(tmp))
            results = {"bprof": measure(sys.executable, "bprof", paths, args.repeat)}
            mb = results["bprof"]["bytes"] / 1e6 if results["bprof"] else None
            big = mb is not None and mb > 1000
            results["orjson"] = None if big else measure(sys.executable, "orjson", paths, args.repeat)
            results["duckdb"] = measure(sys.executable, "duckdb", arrays, 1 if big else args.repeat)
            hta_paths = paths if hta_input is True else [hta_input] if hta_input else None
            results["hta"] = measure(hta, "hta", hta_paths, args.repeat) if hta and hta_paths else None
        for tool, r in results.items():
            if r:
                print(f"  {tool:7s} {mb / r['wall_s']:8.1f} MB/s  wall {r['wall_s']:7.2f} s  cpu {r['cpu_s']:7.2f} s  "
                      f"peak RSS {r['maxrss_mb']:7.0f} MB")
        b = results["bprof"]
        ratios = {}
        for tool in ("hta", "orjson", "duckdb"):
            if results.get(tool) and b:
                ratios[tool] = (results[tool]["wall_s"] / b["wall_s"], b["maxrss_mb"] / results[tool]["maxrss_mb"])
                print(f"  bprof vs {tool:7s} throughput x{ratios[tool][0]:.2f}   peak RSS ratio (bprof/{tool}) {ratios[tool][1]:.2f}")
        rows.append({"input": label, "mb": mb, "results": results, "ratios": ratios})
    out = DATA / f"ingest-results{'-' + args.only.replace(' ', '_') if args.only else ''}.json"
    out.write_text(json.dumps(rows, indent=2))
    print(f"\nresults written to {out}")


if __name__ == "__main__":
    main()
