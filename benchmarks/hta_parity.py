"""HTA parity: does `bprof analyze --hta-compat` report what HolisticTraceAnalysis 0.5.0 reports?

    .venv/bin/python benchmarks/hta_parity.py             # table; exit 1 if a difference > 0.5 pp
    .venv/bin/python benchmarks/hta_parity.py --golden    # also print tests/analyzers/test_hta_compat.py's GOLDEN
    .venv/bin/python benchmarks/hta_parity.py DIR ...     # other trace folders (one run each) instead

For every GPU trace folder of ../shared/traces (CPU-only traces are skipped: HTA's breakdown has
nothing to measure there), it runs HTA 0.5.0 in its own venv (benchmarks/_hta_breakdown.py: per-rank
get_temporal_breakdown and get_comm_comp_overlap; the venv is made on first use under
bench-data/hta-venv with `pip install HolisticTraceAnalysis==0.5.0`), ingests the same folder into a
temporary store, runs bprof's analysis with `Options(hta_compat=True)` (what `bprof analyze
--hta-compat --json` runs and prints) and compares per rank, in percentage points: idle, compute and
non-compute fractions of HTA's window, and comm_overlap_frac (HTA's comp_comm_overlap_pctg).
bprof's own per-step breakdown is printed beside them, for the deliberate differences
(hta_compat.sql and benchmarks/README.md say which and why).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "bench-data"
SHARED = ROOT.parent / "shared" / "traces"
HTA_VENV = DATA / "hta-venv"
TOLERANCE_PP = 0.5
METRICS = ("idle_frac", "compute_frac", "non_compute_frac", "comm_overlap_frac")


def hta_python() -> str:
    python = HTA_VENV / "bin" / "python"
    if not python.exists():
        print("creating bench-data/hta-venv with HolisticTraceAnalysis 0.5.0 ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "HolisticTraceAnalysis==0.5.0"], check=True)
    return str(python)


def run_hta(python: str, folder: Path) -> dict[int, dict]:
    done = subprocess.run([python, str(ROOT / "benchmarks" / "_hta_breakdown.py"), str(folder)],
                          capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"HTA failed on {folder.name}: {done.stderr.strip()[-2000:]}")
    return {r["rank"]: r for r in json.loads(done.stdout.strip().splitlines()[-1])["ranks"]}


def run_bprof(folder: Path, work: Path) -> tuple[dict[int, dict], int]:
    """(rank -> summary row with its "hta" part, number of device events) for one trace folder."""
    from bprof.analyzers.base import Options
    from bprof.analyzers.run import analyze_run, summary
    from bprof.store.db import open_store
    from bprof.store.ingest import IngestOptions, ingest_paths

    con = open_store(work / f"{folder.name}.duckdb")
    try:
        files = [p for p in folder.iterdir() if p.is_file()]
        # a lone file that does not say its rank (the 2021 sample) is rank 0, as HTA takes it
        [ingested] = ingest_paths(con, [folder], IngestOptions(name=folder.name, rank=0 if len(files) == 1 else None,
                                                               work_dir=work))
        num_device = con.execute("SELECT count(*) FROM events WHERE run_id = ? AND kind IN ('kernel', 'gpu_memcpy', 'gpu_memset')",
                                 [ingested.run_id]).fetchone()[0]
        if not num_device:
            return {}, 0
        analyze_run(con, ingested.run_id, Options(hta_compat=True))
        return {r["rank"]: r for r in summary(con, ingested.run_id)["ranks"]}, num_device
    finally:
        con.close()


def compare(hta: dict[int, dict], ours: dict[int, dict]) -> list[dict]:
    """One row per rank and metric: HTA, bprof --hta-compat, difference in percentage points."""
    rows = []
    for rank in sorted(set(hta) | set(ours)):
        compat = (ours.get(rank) or {}).get("hta") or {}
        for metric in METRICS:
            h, b = (hta.get(rank) or {}).get(metric), compat.get(metric)
            diff_pp = None if h is None or b is None else 100 * (b - h)
            # a value on one side only (a rank or the overlap missing) is a mismatch too
            ok = (h is None and b is None) or (diff_pp is not None and abs(diff_pp) <= TOLERANCE_PP)
            rows.append({"rank": rank, "metric": metric, "hta": h, "bprof": b, "diff_pp": diff_pp, "ok": ok})
    return rows


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:8.3f}"


def print_trace(name: str, rows: list[dict], ours: dict[int, dict], hta: dict[int, dict]) -> None:
    print(f"\n{name}")
    for rank in sorted(hta):
        h = hta[rank]
        print(f"  rank {rank}: HTA window {h['window_dur_us'] / 1e3:.3f} ms, {h['num_gpu_events']} GPU events")
    print(f"  {'rank':>4}  {'metric':<18} {'HTA %':>9} {'compat %':>9} {'diff pp':>9}")
    for r in rows:
        diff = "-" if r["diff_pp"] is None else f"{r['diff_pp']:+9.4f}"
        print(f"  {r['rank']:>4}  {r['metric']:<18} {_pct(r['hta']):>9} {_pct(r['bprof']):>9} {diff:>9}"
              f"{'' if r['ok'] else '  <-- over ' + str(TOLERANCE_PP) + ' pp'}")
    for rank, r in sorted(ours.items()):
        non_compute = r["exposed_comm_frac"] + r["memcpy_frac"] + r["other_frac"]
        print(f"  rank {rank} bprof's own breakdown ({r['num_steps']} steps, median {r['median_step_ns'] / 1e6:.3f} ms): "
              f"idle {_pct(r['idle_frac']).strip()} %, compute {_pct(r['compute_frac'] + r['overlapped_comm_frac']).strip()} %, "
              f"non-compute {_pct(non_compute).strip()} %, comm overlap {_pct(r['comm_overlap_frac']).strip()} %")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="*", type=Path, help="trace folders to compare (default: every folder of ../shared/traces)")
    parser.add_argument("--golden", action="store_true", help="print the GOLDEN constants for tests/analyzers/test_hta_compat.py")
    parser.add_argument("--json", type=Path, help="also write every comparison row to this file")
    args = parser.parse_args()
    if not args.folders and not SHARED.exists():
        print(f"hta_parity: {SHARED} is missing (../shared exists only in development checkouts); nothing to compare")
        return 0
    folders = args.folders or sorted(p for p in SHARED.iterdir() if p.is_dir())
    python = hta_python()
    results, golden, failures, max_diff = {}, {}, 0, 0.0
    DATA.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=DATA, prefix="hta-parity-") as tmp:
        for folder in folders:
            ours, num_device = run_bprof(folder, Path(tmp))
            if not num_device:
                print(f"\n{folder.name}: no GPU events (CPU-only trace), skipped")
                continue
            hta = run_hta(python, folder)
            rows = compare(hta, ours)
            print_trace(folder.name, rows, ours, hta)
            results[folder.name] = rows
            failures += sum(not r["ok"] for r in rows)
            max_diff = max([max_diff] + [abs(r["diff_pp"]) for r in rows if r["diff_pp"] is not None])
            golden[folder.name] = {rank: {m: h.get(m) for m in METRICS} for rank, h in sorted(hta.items())}
    print(f"\n{len(results)} GPU traces, max |difference| {max_diff:.4f} pp, "
          f"{failures} value(s) over {TOLERANCE_PP} pp or missing on one side")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if args.golden:
        print("\nGOLDEN = {")
        for name, ranks in golden.items():
            print(f"    {name!r}: {{")
            for rank, values in ranks.items():
                print(f"        {rank}: {{" + ", ".join(f"{m!r}: {v!r}" for m, v in values.items()) + "},")
            print("    },")
        print("}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
