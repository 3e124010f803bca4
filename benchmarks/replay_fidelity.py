"""How faithfully does `bprof replay` reproduce traced op times, and what do the planted fixes buy?

Records examples/train_gpt.py (2 CPU ranks, gloo, OMP_NUM_THREADS=1) with --no-bucket
--transposed-matmul --matmul-loop under bprof record, analyses it, replays its top op signatures and
the planted cases, and prints: the median replayed/traced ratio over the top ops with its range,
the replays' spread, and each planted case's speedup and verdict. With --together N the top ops are
replayed again with N - 1 neighbour processes running each, and both fidelities are printed.

With --chains, instead: op chains and torch.compile. Records tests/replay/gelu_mlp.py (DDP, 2 CPU
ranks, an MLP with the tanh GELU written out in eager ops) twice without and twice with
--execution-trace, interleaved, and prints what the execution trace costs the traced times (median
step, and the median durations of the GELU's ops, with against without), then replays the top op
chains of the last recording with the compile variant: traced, replayed, speedup, verdict, compile
seconds.

    .venv/bin/python benchmarks/replay_fidelity.py [--out DIR] [--top N] [--repeats R] [--together 2]
    .venv/bin/python benchmarks/replay_fidelity.py --chains [--out DIR] [--top 3] [--repeats 9]
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
    p.add_argument("--chains", action="store_true", help="op chains and torch.compile (see above)")
    p.add_argument("--together", type=int, default=1,
                   help="also replay the top ops again with --together N (N ranks sharing the host) and compare fidelity")
    a = p.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="bprof-replay-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    if a.chains:
        return chains(out, a.top, a.repeats)
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
    if a.together > 1:
        again = json.loads(bprof("replay", "--db", str(db), "--top", str(a.top), "--repeats", str(a.repeats), "--variant", "bf16",
                                 "--together", str(a.together), "--json", cwd=out))
        shared = {r["item_key"]: r for r in again if r["item_kind"] == "op" and r["variant"] == "baseline" and r["status"] == "replayed"}
        pairs = [(r, shared[r["item_key"]]) for r in ops if r["item_key"] in shared]
        alone_r = [r["replayed_ns"] / r["traced_ns"] for r, _ in pairs]
        shared_r = [s["replayed_ns"] / s["traced_ns"] for _, s in pairs]
        print(f"--together {a.together} ({a.together - 1} neighbour process(es) running each op): median replayed/traced "
              f"{statistics.median(shared_r):.2f} (range {min(shared_r):.2f}-{max(shared_r):.2f}) against "
              f"{statistics.median(alone_r):.2f} alone over the same {len(pairs)} ops; median replay spread "
              f"{100 * statistics.median(s['replayed_spread_frac'] or 0 for _, s in pairs):.0f}%")
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


GELU_OPS = ("aten::mul", "aten::pow", "aten::add", "aten::tanh")


def chains(out: Path, top: int, repeats: int) -> None:
    import duckdb

    stats = {}
    for i in range(2):
        for et in (False, True):
            name = f"{'et' if et else 'plain'}{i}"
            db = out / f"{name}.duckdb"
            db.unlink(missing_ok=True)
            bprof("record", "--out", str(out / name), "--db", str(db), "--name", name, "--steps", "3:6",
                  *(["--execution-trace"] if et else []), "--",
                  sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                  str(ROOT / "tests" / "replay" / "gelu_mlp.py"), "--tokens", "1024", "--hidden", "256", cwd=out)
            con = duckdb.connect(str(db), read_only=True)
            step = con.execute("SELECT median(dur_ns) FROM steps").fetchone()[0]
            ops = dict(con.execute("SELECT name, median(dur_ns) FROM events WHERE kind = 'cpu_op' AND step IS NOT NULL "
                                   "AND name IN (SELECT unnest(?)) GROUP BY name", [list(GELU_OPS)]).fetchall())
            con.close()
            stats[name] = (step, ops)
            print(f"{name:7s} median step {step / 1e6:7.2f} ms  " + "  ".join(f"{k[6:]} {v / 1e3:.0f} us" for k, v in sorted(ops.items())))
    for i in range(2):
        (s0, o0), (s1, o1) = stats[f"plain{i}"], stats[f"et{i}"]
        op_ratios = [o1[k] / o0[k] for k in GELU_OPS if k in o0 and k in o1]
        print(f"pair {i}: with/without execution trace: step {s1 / s0:.2f}, GELU op durations "
              f"{min(op_ratios):.2f}-{max(op_ratios):.2f} (median {statistics.median(op_ratios):.2f})")
    db = out / "et1.duckdb"
    rows = json.loads(bprof("replay", "--db", str(db), "--top", str(top), "--repeats", str(repeats), "--variant", "compile",
                            "--json", cwd=out))
    base = {r["item_key"]: r for r in rows if r["item_kind"] == "op_chain" and r["variant"] == "baseline"}
    for r in rows:
        if r["item_kind"] == "op_chain" and r["variant"] == "compile":
            b = base[r["item_key"]]
            timing = (f"replayed {b['replayed_ns'] / 1e3:.0f} us -> compiled {r['replayed_ns'] / 1e3:.0f} us, "
                      f"{r['speedup']:.2f}x {r['verdict']} (spreads {100 * (b['replayed_spread_frac'] or 0):.0f}% / "
                      f"{100 * (r['replayed_spread_frac'] or 0):.0f}%)" if r["status"] == "replayed" else r["status"])
            print(f"  {r['item'][:64]:64s} traced {b['traced_ns'] / 1e3:.0f} us, {timing}; {r['reason']}")
    print(f"stores: {out}")


if __name__ == "__main__":
    main()
