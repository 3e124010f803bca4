"""The Hugging Face `Trainer` under torchrun and `bprof record`: 2 CPU ranks (gloo), a 1-layer GPT-2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.launchers.recording import (analyze, assert_collectives_identified, assert_every_rank_recorded, free_port,
                                       rank_metas, record)

pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate (pip install -e '.[launchers]')")
pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("hf_trainer_train.py")


def test_trainer_under_torchrun_records_every_rank_and_its_ddp_all_reduces(tmp_path):
    done = record(tmp_path, [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                             "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(SCRIPT), "--steps", "6",
                             "--out", str(tmp_path / "trainer_out")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hf_trainer_train: rank 0 of 2 done" in done.stdout and "hf_trainer_train: rank 1 of 2 done" in done.stdout
    con, run_id = assert_every_rank_recorded(tmp_path, 2)
    assert {r: m["backend"] for r, m in rank_metas(tmp_path).items()} == {0: "gloo", 1: "gloo"}
    assert "all_reduce" in assert_collectives_identified(con, run_id, 2)
    con.close()
    assert sorted(r["rank"] for r in analyze(tmp_path)["ranks"]) == [0, 1]
