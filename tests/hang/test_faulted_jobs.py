"""`bprof hang` on the dumps of real hung gloo jobs (4 ranks under torchrun, one fault each,
injected from outside bprof): the culprit named with its reason, not its victims."""

from __future__ import annotations

import json
import shutil

import pytest

from bprof.hang.dumps import load_job
from bprof.hang.verdict import analyze
from tests.hang.jobs import bprof

def _verdict(folder):
    return analyze(load_job([folder])).to_json()

def _culprits(v):
    return [(c["rank"], c["reason"]) for c in v["culprits"]]

def _group(v, name):
    return next(g for g in v["groups"] if g["process_group"] == name)

def test_rank_blocked_in_python_is_named_with_its_frame(faulted_job):
    folder, job = faulted_job("block")
    assert job.returncode != 0, job.stderr[-2000:]
    v = _verdict(folder)
    assert _culprits(v) == [(1, "not_joined")]
    c = v["culprits"][0]
    assert c["process_group"] == "0"
    assert any(f.startswith("block_forever (") and "hang_train.py" in f for f in c["stack"]), c["stack"]
    g = _group(v, "0")
    assert g["not_joined"] == [1] and g["waiting"] == [0, 2, 3]
    assert g["stuck_seq"] == c["last_seq"] + 1
    assert v["mismatches"] == []

@pytest.mark.parametrize("damage", ["missing", "empty", "truncated"])
def test_culprit_without_its_dump_is_still_named(faulted_job, tmp_path, damage):
    folder, _ = faulted_job("block")
    full = _verdict(folder)
    shutil.copytree(folder, tmp_path / "d")
    dump = tmp_path / "d" / "nccl_trace_rank_1"
    (tmp_path / "d" / "rank1.stack.txt").unlink()
    if damage == "missing":
        dump.unlink()
    elif damage == "empty":
        dump.write_bytes(b"")
    else:
        dump.write_bytes(dump.read_bytes()[: dump.stat().st_size // 2])
    v = _verdict(tmp_path / "d")
    assert _culprits(v) == [(1, "no_dump")]
    # its peers completed everything before the stuck collective, which needed rank 1
    assert v["culprits"][0]["last_seq"] == full["culprits"][0]["last_seq"]
    assert _group(v, "0")["no_dump"] == [1]
    done = bprof("hang", str(tmp_path / "d"))
    assert done.returncode == 0, done.stderr
    expected_note = {"missing": "dump missing", "empty": "dump empty", "truncated": "dump unreadable"}[damage]
    assert f"rank 1: {expected_note}" in done.stdout

def test_desync_rank_skipping_a_collective_is_a_mismatch(faulted_job):
    folder, job = faulted_job("desync")
    assert job.returncode != 0
    v = _verdict(folder)
    assert _culprits(v) == [(1, "mismatch")]
    first = v["mismatches"][0]
    assert first["rank"] == 1 and first["majority_ranks"] == [0, 2, 3]
    assert "op" in first["differs_in"]
    assert first["expected"]["op"] == "broadcast"  # the call rank 1 skipped

def test_size_mismatch_from_json_dumps(faulted_job):
    folder, job = faulted_job("size", "json")
    assert job.returncode != 0
    assert (folder / "nccl_trace_rank_0").read_bytes()[:1] == b"{"
    v = _verdict(folder)
    assert _culprits(v) == [(1, "mismatch")]
    first = v["mismatches"][0]
    assert first["differs_in"] == ["input_sizes", "output_sizes"]
    assert first["expected"]["input_sizes"] == [[1]] and first["actual"]["input_sizes"] == [[2]]

def test_dead_rank_is_the_one_without_a_dump(faulted_job):
    folder, job = faulted_job("dead")
    assert job.returncode != 0
    assert not (folder / "nccl_trace_rank_1").exists()
    v = _verdict(folder)
    assert _culprits(v) == [(1, "no_dump")]
    assert _group(v, "0")["waiting"] == [0, 2, 3]

def test_tp_rank_stall_names_the_root_not_its_dp_peers(faulted_job):
    folder, job = faulted_job("tp_block")
    assert job.returncode != 0
    v = _verdict(folder)
    assert _culprits(v) == [(1, "not_joined")]
    by_ranks = {tuple(g["ranks"]): g for g in v["groups"]}
    assert by_ranks[(0, 1)]["desc"] == "tp" and by_ranks[(0, 1)]["not_joined"] == [1]
    # rank 0 never joined its DP all-reduce: it waits in TP for rank 1, a victim, not a culprit
    assert by_ranks[(0, 2)]["not_joined"] == [0] and by_ranks[(0, 2)]["waiting"] == [2]
    assert by_ranks[(1, 3)]["not_joined"] == [1]
    assert not by_ranks[(2, 3)]["stuck"]
    assert v["culprits"][0]["process_group"] == by_ranks[(0, 1)]["process_group"]

def test_cli_json_shape_and_plain_verdict(faulted_job):
    folder, _ = faulted_job("tp_block")
    done = bprof("hang", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert set(out) == {"verdict", "culprits", "groups", "mismatches"}
    assert [set(c) for c in out["culprits"]] == [{"rank", "reason", "process_group", "last_seq", "stack"}]
    assert out["verdict"].startswith("rank 1 never joined")
    plain = bprof("hang", str(folder))
    assert plain.stdout.splitlines()[0] == f"verdict: {out['verdict']}"
    assert "  1. rank 1  not_joined" in plain.stdout


def test_missing_last_rank_needs_the_world_size(faulted_job, tmp_path):
    folder, _ = faulted_job("block")
    shutil.copytree(folder, tmp_path / "d")
    (tmp_path / "d" / "nccl_trace_rank_3").unlink()  # gloo dumps carry no group members: rank 3 is unseen
    assert 3 not in {c["rank"] for c in _verdict(tmp_path / "d")["groups"][0]["members"]}
    done = bprof("hang", str(tmp_path / "d"), "--world-size", "4", "--json")
    assert done.returncode == 0, done.stderr
    v = json.loads(done.stdout)
    assert sorted((c["rank"], c["reason"]) for c in v["culprits"]) == [(1, "not_joined"), (3, "no_dump")]
