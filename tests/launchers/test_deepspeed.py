"""The `deepspeed` launcher under `bprof record`: deepspeed.initialize with ZeRO stage 1 on DeepSpeed's
CPU accelerator (gloo)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.launchers.recording import (analyze, assert_collectives_identified, assert_every_rank_recorded, free_port,
                                       rank_metas, record)

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install -e '.[launchers]')")
pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("ds_train.py")


def test_zero_stage_1_on_two_cpu_ranks_records_every_rank_and_deepspeeds_collectives(tmp_path):
    exe = shutil.which("deepspeed", path=str(Path(sys.executable).parent))
    if exe is None:
        pytest.skip("the deepspeed command is not installed beside this Python")
    done = record(tmp_path, [exe, "--num_gpus", "2", "--master_port", str(free_port()), str(SCRIPT), "--steps", "6"],
                  timeout=400, env={"DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ds_train: rank 0 of 2 done" in done.stdout and "ds_train: rank 1 of 2 done" in done.stdout
    con, run_id = assert_every_rank_recorded(tmp_path, 2)
    assert {r: (m["local_rank"], m["backend"]) for r, m in rank_metas(tmp_path).items()} == {0: (0, "gloo"), 1: (1, "gloo")}
    # ZeRO-1 through deepspeed.comm: gradients all-reduced, the updated partitions all-gathered
    assert {"all_reduce", "all_gather"} <= assert_collectives_identified(con, run_id, 2)
    con.close()
    assert sorted(r["rank"] for r in analyze(tmp_path)["ranks"]) == [0, 1]
