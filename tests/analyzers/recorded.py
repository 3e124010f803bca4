"""Real runs for analyzer tests: `bprof record` of examples/train_gpt.py under torchrun on CPU ranks
(gloo), or a trace folder of ../shared/traces, ingested into a store and analysed with a chosen
list of analyzers (after timeline and breakdown)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from tests.conftest import run_group, upstream_exit_abort

ROOT = Path(__file__).resolve().parents[2]
# the upstream exit abort (tests/conftest.py) hit both of two attempts of one recording in CI twice
RECORD_ATTEMPTS = 3
TRAINER = ROOT / "examples" / "train_gpt.py"


def record_train_gpt(out: Path, name: str, trainer_args: list[str], *, record_args: list[str] = (),
                     nproc: int = 2, steps: str = "3:6", timeout: int = 300) -> Path:
    """Record train_gpt.py (DP over `nproc` CPU ranks) into out/<name>.duckdb; returns the store path.
    Reruns once when torch 2.13 aborted the job at interpreter exit, and only then."""
    return record_script(out, name, TRAINER, ["--tp", "1", "--dp", str(nproc), "--steps", str(int(steps.split(":")[1]) + 1),
                                              *trainer_args], record_args=record_args, nproc=nproc, steps=steps,
                         timeout=timeout)


def record_script(out: Path, name: str, script: Path, script_args: list[str], *, record_args: list[str] = (),
                  nproc: int = 2, steps: str = "3:6", timeout: int = 300) -> Path:
    """`bprof record --steps STEPS [record_args] -- torchrun --nproc_per_node NPROC script [script_args]`
    into out/<name>.duckdb (OMP_NUM_THREADS=1); returns the store path."""
    db = out / f"{name}.duckdb"
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(out / name), "--db", str(db),
           "--name", name, "--steps", steps, *record_args, "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           str(script), *script_args]
    for attempt in range(RECORD_ATTEMPTS):
        done = run_group(cmd, timeout=timeout, cwd=out, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if attempt == RECORD_ATTEMPTS - 1 or not upstream_exit_abort(done):
            break
        shutil.rmtree(out / name, ignore_errors=True)
        db.unlink(missing_ok=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return db


def analysed(db: Path, analyzers: list[str] | None):
    """Open the store, run timeline, breakdown and `analyzers` over its one run - or, with None, every
    analyzer as `bprof analyze` does; returns (con, run_id)."""
    con = open_store(db)
    [(run_id,)] = con.execute("SELECT run_id FROM runs").fetchall()
    saved = analysis.ANALYZERS
    analysis.ANALYZERS = saved if analyzers is None else ["timeline", "breakdown", *analyzers]
    try:
        analysis.analyze_run(con, run_id, Options())
    finally:
        analysis.ANALYZERS = saved
    return con, run_id


def findings(con, run_id) -> list[tuple]:
    """(analyzer, severity, lost_ns, title, evidence JSON) by lost_ns, largest first, as bprof analyze ranks them."""
    return con.execute("""SELECT analyzer, severity, lost_ns, title, evidence FROM findings WHERE run_id = ?
                          ORDER BY lost_ns DESC NULLS LAST, severity, finding_id""", [run_id]).fetchall()


def shared(tmp_path: Path, folder: str, analyzers: list[str]):
    """Ingest a real trace folder of ../shared/traces (skips without it) and analyse it; (con, run_id)."""
    from bprof.store.ingest import IngestOptions, ingest_paths
    from tests.conftest import shared_trace

    path = shared_trace(folder)
    db = tmp_path / f"{folder}.duckdb"
    con = open_store(db)
    ingest_paths(con, [path], IngestOptions(rank=0 if len(list(path.iterdir())) == 1 else None, work_dir=tmp_path))
    con.close()
    return analysed(db, analyzers)


def synthetic(out: Path, scenario, analyzers: list[str]):
    """Write a bprof.synth run of `scenario` under `out`, ingest it and run `analyzers` (the whole list,
    in order); returns (con, run_id, truth)."""
    from bprof.store.ingest import IngestOptions, ingest_paths
    from bprof.synth import write_run

    truth = write_run(scenario, out / "run")
    con = open_store(out / "s.duckdb")
    [r] = ingest_paths(con, [out / "run"], IngestOptions(name="synth"))
    saved = analysis.ANALYZERS
    analysis.ANALYZERS = list(analyzers)
    try:
        analysis.analyze_run(con, r.run_id, Options())
    finally:
        analysis.ANALYZERS = saved
    return con, r.run_id, truth
