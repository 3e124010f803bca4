"""Stores for the report's tests, built once per session and only read by the tests:
- `report_store`: a synthetic 8-GPU NCCL run (tp2 pp2 dp2, two hosts, one slow rank) whose GEMM
  kernel is renamed to carry markup (`<script>...`), and a 1,024-rank fleet run (bprof.synth.fleet),
  both ingested and analysed (the synthetic run also given to `bprof whatif`);
- `recorded_store`: a real 4-rank `bprof record` of examples/train_gpt.py (gloo), calibrated and
  analysed by `bprof analyze --json`, whose output comes with it."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.analyzers.recorded import record_train_gpt

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>window.__bprof_pwned = 1</script>&amp;\"q'"
FLEET_RANKS = 1024


def bprof(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)
    assert done.returncode == 0, f"bprof {' '.join(args)}: {done.stderr[-3000:]}"
    return done


def _rename_gemm(path: Path) -> str:
    """Give the rank's most frequent GEMM kernel a hostile name (prefix), as an untrusted trace could."""
    trace = json.loads(gzip.decompress(path.read_bytes()))
    names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "kernel" and "gemm" in e.get("name", "").lower()]
    target = max(set(names), key=names.count)
    for e in trace["traceEvents"]:
        if e.get("name") == target:
            e["name"] = HOSTILE + target
    path.write_bytes(gzip.compress(json.dumps(trace).encode()))
    return HOSTILE + target


@pytest.fixture(scope="session")
def report_store(tmp_path_factory) -> dict:
    from bprof.analyzers import run as analysis
    from bprof.analyzers.base import Options
    from bprof.store.db import open_store
    from bprof.synth.fleet import Fleet, write_fleet

    out = tmp_path_factory.mktemp("report")
    synth = out / "synthetic"
    subprocess.run([sys.executable, "-m", "bprof.synth", str(synth), "--tp", "2", "--pp", "2", "--dp", "2",
                    "--hosts", "2", "--slow-rank", "3"], check=True, capture_output=True, cwd=ROOT)
    hostile = _rename_gemm(synth / "rank0.json.gz")
    db = out / "report.duckdb"
    bprof("ingest", str(synth), "--db", str(db), "--name", "synthetic-8")
    bprof("analyze", "synthetic-8", "--db", str(db))
    bprof("whatif", "synthetic-8", "--db", str(db), "--scenario", "no-host-gaps", "--scenario", "scale:gemm=0.8")
    con = open_store(db)
    truth = write_fleet(con, Fleet(tp=8, pp=4, dp=FLEET_RANKS // 32, microbatches=4, steps=3, tp_per_forward=6,
                                   tp_per_backward=12, dp_collectives=4, slow_rank=333, slow_factor=1.3),
                        name="fleet-1024")
    analysis.analyze_run(con, truth.run_id, Options())
    runs = dict(con.execute("SELECT name, run_id FROM runs").fetchall())
    con.close()
    return {"db": db, "synthetic": runs["synthetic-8"], "fleet": runs["fleet-1024"], "hostile": hostile}


@pytest.fixture(scope="session")
def recorded_store(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("recorded")
    db = record_train_gpt(out, "report-4", [], nproc=4)
    # this machine's measured fp32 peak: the MFU denominator of a CPU run, as `make demo` does
    bprof("calibrate", "--db", str(db), "--dtype", "fp32", "--repeats", "3")
    analysed = json.loads(bprof("analyze", "--db", str(db), "--json").stdout)
    return {"db": db, "analyze": analysed, "run_id": analysed["run"]["run_id"]}
