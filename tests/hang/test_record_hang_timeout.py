"""`bprof record --hang-timeout`: real hung gloo jobs (gloo's own timeout far beyond bprof's) end
by themselves with exit 124, the dumps and stacks in RUN/hang and the verdict printed; a job whose
rank dies names it from what the launcher saw."""

from __future__ import annotations

import json

import pytest

from bprof.profiler.hang_watchdog import HANG_EXIT_CODE
from tests.hang.jobs import bprof, record_faulted


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    runs = {}

    def get(fault):
        if fault not in runs:
            run_dir = tmp_path_factory.mktemp(f"rec_{fault}") / "run"
            runs[fault] = (run_dir, record_faulted(fault, run_dir))
        return runs[fault]

    return get


def _culprits(run_dir):
    v = json.loads((run_dir / "hang" / "verdict.json").read_text())
    return v, [(c["rank"], c["reason"]) for c in v["culprits"]]


def test_python_block_ends_the_job_and_names_the_frame(recorded):
    run_dir, done = recorded("block")
    assert done.returncode == HANG_EXIT_CODE, done.stderr[-3000:]
    assert "verdict: rank 1 never joined" in done.stderr
    v, culprits = _culprits(run_dir)
    assert culprits == [(1, "not_joined")]
    stack = v["culprits"][0]["stack"]
    assert any(f.startswith("block_forever (") and f.split(":")[0].endswith("hang_train.py") for f in stack), stack
    assert any(f.startswith("train_dp (") for f in stack), stack
    for r in range(4):  # every live rank answered the request
        assert (run_dir / "hang" / f"rank{r}.fr.pkl").stat().st_size > 0
    # the offline command reads the same run directory to the same verdict
    again = bprof("hang", str(run_dir), "--json")
    assert json.loads(again.stdout) == v


def test_tp_stall_names_the_root(recorded):
    run_dir, done = recorded("tp_block")
    assert done.returncode == HANG_EXIT_CODE, done.stderr[-3000:]
    v, culprits = _culprits(run_dir)
    assert culprits == [(1, "not_joined")]
    groups = {tuple(g["ranks"]): g for g in v["groups"]}  # members from torch.distributed: gloo dumps lack them
    assert groups[(0, 1)]["desc"] == "tp" and groups[(0, 2)]["desc"] == "dp"
    assert groups[(0, 2)]["not_joined"] == [0]  # a victim of rank 1, not named


def test_size_mismatch_is_named(recorded):
    run_dir, done = recorded("size")
    assert done.returncode == HANG_EXIT_CODE, done.stderr[-3000:]
    v, culprits = _culprits(run_dir)
    assert culprits == [(1, "mismatch")]
    assert v["mismatches"][0]["actual"]["input_sizes"] == [[2]]


def test_dead_rank_is_named_from_the_launcher(recorded):
    run_dir, done = recorded("dead")
    assert done.returncode not in (0, HANG_EXIT_CODE), done.stderr[-3000:]
    v, culprits = _culprits(run_dir)
    assert culprits == [(1, "dead")]
    assert "rank 1 died" in v["verdict"]
    # torchrun stops the peers with SIGTERM: each either exits through Python or, through the
    # program's own handler (os._exit), leaves its SIGTERM stack; the dead rank leaves neither
    hang = run_dir / "hang"
    assert not (hang / "rank1.exit").exists() and (hang / "rank1.sigterm.txt").stat().st_size == 0
    for r in (0, 2, 3):
        sigterm = hang / f"rank{r}.sigterm.txt"
        assert (hang / f"rank{r}.exit").exists() or "most recent call first" in sigterm.read_text(), r


def test_rank_holding_the_gil_gets_a_native_stack(recorded):
    run_dir, done = recorded("gil")
    assert done.returncode == HANG_EXIT_CODE, done.stderr[-3000:]
    v, culprits = _culprits(run_dir)
    # its watch thread never finishes answering (no rank1.done, no groups): no_dump. Since b946443 (the
    # rank decided at the first step) a rank1.fr.pkl is on disk all the same, why is not found yet, and
    # the verdict reads it: not_joined. Either way rank 1 alone is the culprit.
    assert len(culprits) == 1 and culprits[0][0] == 1 and culprits[0][1] in ("no_dump", "not_joined"), culprits
    assert json.loads((run_dir / "hang" / "ranks.json").read_text())["unresponsive"] == [1]
    assert v["culprits"][0]["stack"][0].startswith("hold_gil_forever (")  # faulthandler's C-level dump
    assert "rank 1: alive but did not answer" in done.stderr
