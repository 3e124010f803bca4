"""`bprof analyze` as users run it: real subprocess, --json shape, exit codes, every real GPU trace."""

from __future__ import annotations

import json

import pytest

from tests.cli.test_cli import bprof
from tests.conftest import shared_trace

FRACS = ("compute_frac", "exposed_comm_frac", "overlapped_comm_frac", "memcpy_frac", "idle_frac", "other_frac")


@pytest.fixture(scope="module")
def synthetic_db(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    done = bprof_synth(tmp)
    assert done.returncode == 0, done.stderr
    db = tmp / "s.duckdb"
    assert bprof("ingest", tmp / "run", "--db", db, "--name", "syn").returncode == 0
    return db


def bprof_synth(tmp):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "bprof.synth", str(tmp / "run"), "--tp", "2", "--pp", "2", "--dp", "1",
                           "--slow-rank", "1"], capture_output=True, text=True, timeout=300)


def test_json_has_one_record_per_rank_and_ranked_findings(synthetic_db):
    done = bprof("analyze", "syn", "--db", synthetic_db, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    for r in data["ranks"]:
        assert sum(r[f] for f in FRACS) == pytest.approx(1.0)
        assert 0 <= r["comm_overlap_frac"] <= 1
    lost = [f["lost_ns"] for f in data["findings"] if f["lost_ns"] is not None]
    assert lost == sorted(lost, reverse=True) and lost
    for f in data["findings"]:
        assert {"severity", "lost_ns", "title", "advice", "evidence"} <= f.keys()
        if f["lost_ns"] is not None:
            assert f["evidence"]["ranks"] and "steps" in f["evidence"]
    assert data["metrics"]["step_time_ns"]["value"] > 0
    assert data["metrics"]["mfu_frac"]["value"] is None  # the synthetic run declares no model FLOPs


def test_table_output_and_idempotence(synthetic_db):
    first = bprof("analyze", "--db", synthetic_db)
    assert first.returncode == 0, first.stderr
    assert "Where the step goes" in first.stdout and "Findings" in first.stdout
    again = json.loads(bprof("analyze", "--db", synthetic_db, "--json").stdout)
    once = json.loads(bprof("analyze", "--db", synthetic_db, "--json").stdout)
    assert len(again["findings"]) == len(once["findings"])
    assert again["ranks"] == once["ranks"]


def test_usage_errors_exit_2_with_one_line(synthetic_db, tmp_path):
    missing = bprof("analyze", "no-such-run", "--db", synthetic_db)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1, missing.stderr
    negative = bprof("analyze", "--db", synthetic_db, "--peak-tflops", "-1")
    assert negative.returncode == 2 and "--peak-tflops" in negative.stderr
    no_nic = bprof("analyze", "--db", synthetic_db, "--nic-gbps", "0")
    assert no_nic.returncode == 2 and "--nic-gbps" in no_nic.stderr
    no_store = bprof("analyze", "--db", tmp_path / "absent" / "x.duckdb")
    assert no_store.returncode in (2, 3) and no_store.stderr.startswith("bprof: error:")
    bad_limit = bprof("analyze", "--db", synthetic_db, "--memory-limit", "lots")
    assert bad_limit.returncode == 2 and "'lots' is not a size" in bad_limit.stderr


def test_memory_limit_bounds_duckdb_and_gives_the_same_result(synthetic_db):
    limited = bprof("analyze", "--db", synthetic_db, "--json", "--memory-limit", "300MB")
    assert limited.returncode == 0, limited.stderr
    plain = bprof("analyze", "--db", synthetic_db, "--json")
    assert json.loads(limited.stdout)["ranks"] == json.loads(plain.stdout)["ranks"]


@pytest.mark.parametrize("folder", ["a100_ddp_nccl_rank0", "a100_ws16_rank0", "mi250_rocm_minitoy",
                                    "v100_ns_resolution_rank0", "v100_resnet50_legacy_2021", "cpu_gloo_rank34"])
def test_every_real_trace_analyzes(folder, tmp_path):
    db = tmp_path / "s.duckdb"
    path = shared_trace(folder)
    rank = ["--rank", "0"] if folder == "v100_resnet50_legacy_2021" else []  # the 2021 file does not say its rank
    done = bprof("ingest", *(([next(path.iterdir())] + rank) if rank else [path]), "--db", db)
    assert done.returncode == 0, done.stderr
    done = bprof("analyze", "--db", db, "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    [rank] = data["ranks"]
    assert sum(rank[f] for f in FRACS) == pytest.approx(1.0)
    assert rank["timeline"] == ("main_thread" if folder.startswith("cpu") else "device")
    peak = data["metrics"]["peak_flops_per_s_per_device"]["value"]
    if folder.startswith("cpu"):
        assert peak is None  # never guessed: no calibration for that host
    else:
        assert peak > 1e13  # every shared GPU resolves to a datasheet row
