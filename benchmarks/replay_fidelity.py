"""How faithfully does `bprof replay` reproduce traced op times, and what do the planted fixes buy?

Records examples/train_gpt.py (2 CPU ranks, gloo, OMP_NUM_THREADS=1) with --no-bucket
--transposed-matmul --matmul-loop under bprof record, analyses it, replays its top op signatures and
the planted cases, and prints: the median replayed/traced ratio over the top ops with its range,
the replays' spread, and each planted case's speedup and verdict.

    .venv/bin/python benchmarks/replay_fidelity.py [--out DIR] [--top N] [--repeats R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def bprof(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    if done.returncode != 0:
        sys.exit(f"bprof {' '.join(args[:2])} failed: {done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one)")
    p.add_argument("--top", type=int, default=10)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="bprof-replay-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    db = out / "bench.duckdb"
    db.unlink(missing_ok=True)
    bprof("record", "--out", str(out / "run"), "--db", str(db), "--name", "bench", "--steps", "3:6", "--",
          sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(ROOT / "examples" / "train_gpt.py"),
          "--tp", "1", "--dp", "2", "--steps", "7", "--no-bucket", "--transposed-matmul", "--matmul-loop", cwd=out)
    bprof("analyze", "--db", str(db), "--json", cwd=out)
    top = json.loads(bprof("replay", "--db", str(db), "--top", str(a.top), "--repeats", str(a.repeats),
                           "--variant", "bf16", "--variant", "bucket", "--variant", "msg4x", "--variant", "split4", "--variant", "bmm",
                           "--json", cwd=out))
    planted = json.loads(bprof("replay", "--db", str(db), "--op", "aten::matmul", "--top", "1", "--repeats", str(a.repeats),
                               "--variant", "contiguous", "--json", cwd=out))
    ops = [r for r in top if r["item_kind"] == "op" and r["variant"] == "baseline" and r["status"] == "replayed"]
    ratios = [r["replayed_ns"] / r["traced_ns"] for r in ops]
    print(f"top {len(ops)} op signatures replayed (1 intra-op thread, {a.repeats} repeats each):")
    for r in ops:
        print(f"  {r['item'][:70]:70s} traced {r['traced_ns'] / 1e3:9.1f} us  replayed {r['replayed_ns'] / 1e3:9.1f} us  "
              f"ratio {r['replayed_ns'] / r['traced_ns']:.2f}  spread {100 * (r['replayed_spread_frac'] or 0):.0f}%  {r['classification']}")
    if ratios:
        print(f"median replayed/traced ratio {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}); "
              f"median replay spread {100 * statistics.median(r['replayed_spread_frac'] or 0 for r in ops):.0f}%")
    print("variants:")
    for r in top + planted:
        if r["variant"] != "baseline" and r["status"] == "replayed" and (r["variant"] != "bf16" or r["item_kind"] == "op"):
            print(f"  {r['variant']:10s} {r['item'][:60]:60s} speedup {r['speedup']:.2f}x  {r['verdict']}  "
                  f"(spread {100 * (r['replayed_spread_frac'] or 0):.0f}%)")
    for r in top:
        if r["item_kind"].startswith("collective") and r["variant"] == "baseline" and r["status"] == "replayed":
            print(f"  collective {r['item'][:60]:60s} traced {r['traced_ns'] / 1e3:.0f} us ({r['traced_basis']}) replayed "
                  f"{r['replayed_ns'] / 1e3:.0f} us, busbw {r['busbw_bytes_per_s'] / 1e9:.3f} GB/s")
    print(f"store: {db}")


if __name__ == "__main__":
    main()
