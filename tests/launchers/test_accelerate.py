"""Hugging Face `accelerate launch` under `bprof record`: a real `Accelerator` training script on CPU."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.launchers.recording import (analyze, assert_collectives_identified, assert_every_rank_recorded, free_port,
                                       rank_metas, record)

pytest.importorskip("accelerate", reason="accelerate is not installed (pip install -e '.[launchers]')")
pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("acc_train.py")


def accelerate() -> str:
    exe = shutil.which("accelerate", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the accelerate command is not installed beside this Python")
    return exe


def test_single_process_launch_is_rank_0_of_1_and_its_dataloader_workers_are_not_recorded(tmp_path):
    """`accelerate launch --cpu` starts the script as a child without RANK (issue 26: nothing was
    captured); two DataLoader worker processes and the launcher itself import torch too."""
    done = record(tmp_path, [accelerate(), "launch", "--cpu", "--num_processes", "1", "--num_machines", "1",
                             "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT), "--steps", "6",
                             "--workers", "2"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "acc_train: process 0 of 1 done" in done.stdout
    con, run_id = assert_every_rank_recorded(tmp_path, 1)
    meta = rank_metas(tmp_path)[0]
    claimed_pid = int((tmp_path / "run" / "meta" / "single_process.claim").read_text())
    assert meta["pid"] == claimed_pid and meta["local_rank"] == 0
    assert meta["notes"] == ["rank 0 of 1 from single process (no RANK at import torch)"]
    # no process group, so no distributedInfo: the world size is the one bprof record decided
    assert con.execute("SELECT world_size, missing_ranks FROM runs WHERE run_id = ?", [run_id]).fetchone() == (1, [])
    con.close()  # analyze opens the store for writing
    report = analyze(tmp_path)
    assert [r["rank"] for r in report["ranks"]] == [0] and report["ranks"][0]["num_steps"] == 2


def test_multi_process_launch_records_every_rank_and_its_gloo_all_reduces(tmp_path):
    """accelerate 1.15 has no multi-CPU flag of its own (--cpu with --num_processes 2 runs one
    process; more CPU processes need mpirun): `--multi_gpu` starts torch's elastic launcher, and the
    script's Accelerator(cpu=True) makes a gloo group of the two ranks."""
    done = record(tmp_path, [accelerate(), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
                             "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
                             str(free_port()), str(SCRIPT), "--steps", "6"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "acc_train: process 0 of 2 done" in done.stdout and "acc_train: process 1 of 2 done" in done.stdout
    con, run_id = assert_every_rank_recorded(tmp_path, 2)
    assert {r: (m["local_rank"], m["backend"]) for r, m in rank_metas(tmp_path).items()} == {0: (0, "gloo"), 1: (1, "gloo")}
    assert "all_reduce" in assert_collectives_identified(con, run_id, 2)  # DDP's gradient buckets
    assert not (tmp_path / "run" / "meta" / "single_process.claim").exists()  # the launcher took no rank
    con.close()
    report = analyze(tmp_path)
    assert sorted(r["rank"] for r in report["ranks"]) == [0, 1]
    assert all(r["exposed_comm_frac"] + r["overlapped_comm_frac"] > 0 for r in report["ranks"])
