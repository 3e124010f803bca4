"""Slurm-style launch without torchrun, emulated (Slurm is not installed here): `bprof record --
slurm_launch.py` starts 2 plain tasks with SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID and no RANK."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.launchers.recording import (analyze, assert_collectives_identified, assert_every_rank_recorded, free_port,
                                       rank_metas, record, store)

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
NTASKS = 2


def record_slurm(tmp_path, rank_from: str):
    done = record(tmp_path, [sys.executable, str(HERE / "slurm_launch.py"), str(NTASKS), str(free_port()),
                             str(HERE / "slurm_train.py"), "--steps", "6", "--rank-from", rank_from])
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(f"slurm_train: task {r} of {NTASKS} done" in done.stdout for r in range(NTASKS))
    return done


@pytest.mark.parametrize("rank_from", ["env", "args"])
def test_script_that_maps_slurm_variables_itself_is_recorded_rank_by_rank(tmp_path, rank_from):
    """`env`: the script sets RANK after `import torch`; `args`: it never sets RANK, and gives the
    rank to init_process_group. Either way bprof takes the process group's rank at the first step."""
    record_slurm(tmp_path, rank_from)
    con, run_id = assert_every_rank_recorded(tmp_path, NTASKS)
    metas = rank_metas(tmp_path)
    assert {r: (m["local_rank"], m["backend"]) for r, m in metas.items()} == {0: (0, "gloo"), 1: (1, "gloo")}
    assert all(m["notes"] == [f"rank {r} of {NTASKS} from process group (no RANK at import torch)"] for r, m in metas.items())
    assert "all_reduce" in assert_collectives_identified(con, run_id, NTASKS)
    assert not (tmp_path / "run" / "meta" / "single_process.claim").exists()  # nor did the launcher claim rank 0
    con.close()
    assert sorted(r["rank"] for r in analyze(tmp_path)["ranks"]) == [0, 1]


def test_without_process_group_bprof_maps_slurm_variables_itself(tmp_path):
    """Nothing but SLURM_* says which task is which: bprof's own mapping makes them ranks 0 and 1
    of 2 (and not two processes both claiming rank 0 of a world of 1)."""
    record_slurm(tmp_path, "none")
    metas = rank_metas(tmp_path)
    assert sorted(metas) == [0, 1]
    for r, m in metas.items():
        assert (m["rank"], m["world_size"], m["local_rank"]) == (r, NTASKS, r)
        assert m["notes"] == [f"rank {r} of {NTASKS} from SLURM_PROCID (no RANK at import torch)"]
        assert [w["window"] for w in m["windows_captured"]] == ["2:4"]
    assert len({m["pid"] for m in metas.values()}) == NTASKS
    con = store(tmp_path)
    steps = con.execute("SELECT rank, list(DISTINCT step ORDER BY step) FROM steps GROUP BY rank ORDER BY rank").fetchall()
    assert steps == [(0, [2, 3]), (1, [2, 3])]
    assert con.execute("SELECT count(*) FROM collectives").fetchone()[0] == 0  # no group, no collectives
    con.close()
    assert sorted(r["rank"] for r in analyze(tmp_path)["ranks"]) == [0, 1]
