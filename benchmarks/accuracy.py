"""Right answers on programs written the way users write them: per program x fault, the cause bprof
ranks first, its lost_ns, the measured counterfactual, the what-if prediction and their errors.

    .venv/bin/python benchmarks/accuracy.py                  # 3 interleaved rounds (~8 min here)
    .venv/bin/python benchmarks/accuracy.py --rounds 5 --json out.json

Truth is measured, never assumed: every round records the program without any fault and once with
each fault, one after the other under the same load (2 CPU ranks, gloo, `bprof record`, steps 3:9).
A fault's measured cost is its run's step minus the clean run's of the same round (job step: the
longest rank's span, median over steps, as `bprof analyze` reports it); the what-if's truth is the
clean run itself, the real run of the counterfactual configuration.

Programs (tests/programs): ddp_mlp.py - an MLP under torch's DistributedDataParallel (C++ reducer,
1 MB buckets: 8 all-reduces a step issued from autograd hooks during backward). Faults, injected
by the program's own flags: a slow rank (60 ms of extra compute before forward, inside forward, in
a backward hook), a DataLoader whose dataset stalls (40 ms a batch on every rank).

Every recording and analysis runs from a copy of bprof/, examples/ and tests/programs taken at the
start (benchmarks/_code.py); the commit is printed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import _code  # noqa: E402

CONFIG = ["--steps", "10", "--dim", "512", "--layers", "8", "--bucket-cap-mb", "1"]
SLOW = ["--slow-rank", "1", "--slow-ms", "60"]
# fault -> (program flags, the cause expected first (analyzer, ranks or None), the what-if scenario)
FAULTS = {
    "slow rank, before forward": ([*SLOW, "--slow-where", "before"], ("stragglers", [1]), "no-stragglers"),
    "slow rank, inside forward": ([*SLOW, "--slow-where", "forward"], ("stragglers", [1]), "no-stragglers"),
    "slow rank, backward hook": ([*SLOW, "--slow-where", "hook"], ("stragglers", [1]), "no-stragglers"),
    "stalling DataLoader": (["--stall-ms", "40"], ("phases", None), "no-host-gaps:data_loading"),
}


def record(code: Path, work: Path, name: str, args: list[str]) -> Path:
    db = work / f"{name}.duckdb"
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(work / name), "--db", str(db), "--name", name,
           "--steps", "3:9", "--", sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(code / "tests" / "programs" / "ddp_mlp.py"), *CONFIG, *args]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=work, env=_code.child_env(code, OMP_NUM_THREADS="1"),
                          timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"recording {name} failed: {done.stderr[-2000:]}")
    return db


def cli(code: Path, work: Path, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", *args, "--json"], capture_output=True, text=True,
                          cwd=work, env=_code.child_env(code), timeout=600)
    if done.returncode not in (0, 3):
        raise SystemExit(f"bprof {' '.join(args)} failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr.strip()}


def measure(code: Path, work: Path, name: str, args: list[str], scenario: str | None) -> dict:
    db = str(record(code, work, name, args))
    analysis = cli(code, work, "analyze", "--db", db)
    out = {"step_ns": analysis["metrics"]["step_time_ns"]["value"],
           "findings": [f for f in analysis["findings"] if f["lost_ns"] is not None]}
    if scenario:
        w = cli(code, work, "whatif", "--db", db, "-s", scenario)
        out["predicted_ns"] = None if "error" in w else w["scenarios"][1]["predicted_step_ns"]
        out["whatif_error"] = w.get("error")
    return out


def _cause_ok(found: list[dict], expected: tuple[str, list[int] | None]) -> bool:
    if not found:
        return False
    top = found[0]
    analyzer, ranks = expected
    return top["analyzer"] == analyzer and (ranks is None or top["evidence"].get("ranks") == ranks)


def _ms(values: list[float]) -> str:
    if not values:
        return "n/a"
    m = statistics.mean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return f"{m / 1e6:7.1f} ± {se / 1e6:4.1f}"


def _pct(values: list[float]) -> str:
    if not values:
        return "n/a"
    m = statistics.mean(values)
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return f"{m:+6.1%} ± {se:4.1%}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", type=Path)
    p.add_argument("--dir", type=Path, help="keep the runs here (default: a temporary folder, removed)")
    a = p.parse_args()
    work = a.dir or Path(tempfile.mkdtemp(prefix="bprof-accuracy-"))
    work.mkdir(parents=True, exist_ok=True)
    code = _code.snapshot(ROOT, work)
    shutil.copytree(ROOT / "tests" / "programs", code / "tests" / "programs", ignore=shutil.ignore_patterns("__pycache__"))
    print(f"code: {_code.describe(ROOT)}; {a.rounds} rounds; runs in {work}")
    rows: dict[str, list[dict]] = {f: [] for f in FAULTS}
    for r in range(a.rounds):
        clean = measure(code, work, f"r{r}_clean", [], None)
        for i, (fault, (args, expected, scenario)) in enumerate(FAULTS.items()):
            got = measure(code, work, f"r{r}_f{i}", args, scenario)
            truth = got["step_ns"] - clean["step_ns"]
            top = got["findings"][0] if got["findings"] else None
            row = {"round": r, "clean_step_ns": clean["step_ns"], "step_ns": got["step_ns"], "truth_ns": truth,
                   "cause_ok": _cause_ok(got["findings"], expected),
                   "top": None if top is None else {"analyzer": top["analyzer"], "title": top["title"], "lost_ns": top["lost_ns"]},
                   "predicted_ns": got.get("predicted_ns"), "whatif_error": got.get("whatif_error")}
            rows[fault].append(row)
            lost = f"{top['lost_ns'] / 1e6:.1f}" if top else "-"
            pred = f"{row['predicted_ns'] / 1e6:.1f}" if row["predicted_ns"] else f"withheld ({row['whatif_error']})"
            print(f"round {r} {fault:<28} clean {clean['step_ns'] / 1e6:6.1f} ms, faulted {got['step_ns'] / 1e6:6.1f} ms, "
                  f"truth {truth / 1e6:6.1f} ms; first: {top['analyzer'] if top else '-'} {lost} ms "
                  f"({'right' if row['cause_ok'] else 'WRONG'}); {scenario} predicts {pred} ms", flush=True)
    print()
    print(f"{'program x fault':<34} {'cause first':>11} {'lost_ns (ms)':>15} {'truth (ms)':>15} {'lost err':>15} "
          f"{'what-if (ms)':>15} {'clean (ms)':>15} {'what-if err':>15}")
    for fault, rs in rows.items():
        lost = [x["top"]["lost_ns"] for x in rs if x["top"]]
        truth = [x["truth_ns"] for x in rs]
        lost_err = [(x["top"]["lost_ns"] - x["truth_ns"]) / x["truth_ns"] for x in rs if x["top"] and x["truth_ns"] > 0]
        pred = [x["predicted_ns"] for x in rs if x["predicted_ns"]]
        clean = [x["clean_step_ns"] for x in rs]
        pred_err = [(x["predicted_ns"] - x["clean_step_ns"]) / x["clean_step_ns"] for x in rs if x["predicted_ns"]]
        print(f"{'ddp_mlp x ' + fault:<34} {sum(x['cause_ok'] for x in rs):>5}/{len(rs):<5} {_ms(lost):>15} {_ms(truth):>15} "
              f"{_pct(lost_err):>15} {_ms(pred):>15} {_ms(clean):>15} {_pct(pred_err):>15}")
    if a.json:
        a.json.write_text(json.dumps({"code": _code.describe(ROOT), "rows": rows}, indent=1))
    if not a.dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
