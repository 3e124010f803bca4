"""How the cost of `bprof analyze` grows with ranks and with events per rank (synthetic runs).

    .venv/bin/python benchmarks/analyze.py            # ranks 8, 32, 128 x events_scale 1, 4
    .venv/bin/python benchmarks/analyze.py --quick    # ranks 8, 32 x events_scale 1

Each configuration is a synthetic NCCL run (bprof.synth, tp=2 pp=2 dp=world/4, 3 steps) ingested
into its own store; `analyze_run` (every analyzer) then runs --repeat times in this process and the
best wall time counts. It prints events, seconds, events/s and the time ratio against the smallest
configuration measured in the same run (the machine is shared and noisy: compare ratios, not
absolute times). Linear cost means the time ratio follows the events ratio. Seconds per analyzer
are shown in parentheses.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bprof.analyzers.base import Options  # noqa: E402
from bprof.analyzers.run import analyze_run  # noqa: E402
from bprof.store.db import open_store  # noqa: E402
from bprof.store.ingest import IngestOptions, ingest_paths  # noqa: E402
from bprof.synth import Scenario, write_run  # noqa: E402


def measure(world: int, events_scale: float, repeat: int, tmp: Path) -> dict:
    out = tmp / f"w{world}-s{events_scale}"
    write_run(Scenario(tp=2, pp=2, dp=world // 4, steps=3, hosts=max(1, world // 8), seed=1,
                       events_scale=events_scale), out / "run", gzip=False)
    con = open_store(out / "s.duckdb")
    [r] = ingest_paths(con, [out / "run"], IngestOptions(name="bench"))
    best, per_analyzer = float("inf"), {}
    for _ in range(repeat):
        marks = []
        t0 = time.perf_counter()
        analyze_run(con, r.run_id, Options(), progress=lambda name: marks.append((name, time.perf_counter())))
        total = time.perf_counter() - t0
        if total < best:
            ends = [t for _, t in marks[1:]] + [t0 + total]
            best, per_analyzer = total, {name: end - t for (name, t), end in zip(marks, ends)}
    con.close()
    return {"ranks": world, "events_scale": events_scale, "events": r.num_events, "seconds": best,
            "per_analyzer": per_analyzer}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    configs = [(8, 1.0), (32, 1.0)] if args.quick else [(8, 1.0), (32, 1.0), (128, 1.0), (8, 4.0), (32, 4.0)]
    rows = []
    with tempfile.TemporaryDirectory(dir=ROOT / "bench-data" if (ROOT / "bench-data").exists() else None) as tmp:
        for world, scale in configs:
            rows.append(measure(world, scale, args.repeat, Path(tmp)))
            r = rows[-1]
            print(f"ranks {r['ranks']:>4}  events_scale {r['events_scale']:>3}  events {r['events']:>10,}  "
                  f"analyze {r['seconds']:7.2f} s  {r['events'] / r['seconds']:>10,.0f} events/s  ("
                  + ", ".join(f"{k} {v:.2f}" for k, v in r["per_analyzer"].items()) + ")", flush=True)
    base = rows[0]
    print("\nratios against the first configuration (same run):")
    for r in rows:
        print(f"ranks {r['ranks']:>4}  events_scale {r['events_scale']:>3}  events x{r['events'] / base['events']:6.1f}"
              f"  time x{r['seconds'] / base['seconds']:6.1f}")


if __name__ == "__main__":
    main()
