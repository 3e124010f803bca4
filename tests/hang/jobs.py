"""Real hung jobs for `bprof hang`'s tests: tests/hang/hang_train.py under torchrun (4 CPU ranks,
gloo) with one fault injected from outside bprof; every rank writes its Flight Recorder dump as
torch's NCCL watchdog would (TORCH_NCCL_DUMP_ON_TIMEOUT). The job ends by itself: gloo's
collective timeout fails the waiting ranks, torchrun stops the rest (the test kills the whole
process tree if it does not)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import run_group

PROGRAM = Path(__file__).with_name("hang_train.py")
ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
JOB_TIMEOUT_S = 240  # a job that outlives this has not ended by itself: the test fails


def run_faulted(fault: str, out: Path, *, rank: int = 1, dump_format: str = "pickle") -> subprocess.CompletedProcess:
    """Run the faulted job; its dumps land in out/ as nccl_trace_rank_<R> (and rank<R>.stack.txt)."""
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HANG_FAULT": fault, "HANG_RANK": str(rank), "HANG_DUMP": f"{out}/nccl_trace_rank_",
           "HANG_DUMP_FORMAT": dump_format, "TORCH_FR_BUFFER_SIZE": "2000", "PYTHONPATH": str(ROOT)}
    env.pop("BPROF_RUN_DIR", None)
    return run_group([*TORCHRUN, str(PROGRAM)], timeout=JOB_TIMEOUT_S, env=env, cwd=ROOT)


def bprof(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bprof.cli.main", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


def record_faulted(fault: str, run_dir: Path, *, hang_timeout_s: float = 5, rank: int = 1, steps: str = "100:101",
                   db: Path | None = None, slow_ms: int = 0) -> subprocess.CompletedProcess:
    """`bprof record --hang-timeout` of the faulted job; gloo's own timeout is set far beyond it
    (NCCL's default is 10 minutes), so bprof, not gloo, has to end the job. By default no window is
    captured (--steps 100:101) and nothing ingested; with `db` the windows of `steps` are ingested
    there, and `slow_ms` makes the faulty rank a straggler in them."""
    env = {**os.environ, "HANG_FAULT": fault, "HANG_RANK": str(rank), "HANG_PG_TIMEOUT_S": "600",
           "HANG_SLOW_MS": str(slow_ms), "PYTHONPATH": str(ROOT)}
    for k in ("BPROF_RUN_DIR", "HANG_DUMP"):
        env.pop(k, None)
    store = ["--db", str(db)] if db is not None else ["--no-ingest"]
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(run_dir), "--steps", steps,
           *store, "--hang-timeout", str(hang_timeout_s), "--", *TORCHRUN, str(PROGRAM)]
    return run_group(cmd, timeout=JOB_TIMEOUT_S, env=env, cwd=ROOT)
