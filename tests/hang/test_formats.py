"""Dump format versions torch 2.2-2.13 write (field names per version from torch's own writer:
TraceUtils.h of 2.2-2.3 for 1.x, FlightRecorderDetail.hpp of 2.13 for 2.x), missing and broken
files, and stack texts; small inline dumps with exact expected verdicts."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

from bprof.hang.dumps import load_job, read_dump, training_thread_frames
from bprof.hang.verdict import analyze
from tests.hang.jobs import bprof
from tests.test_no_torch import TORCH_BLOCKER


def _v1_entry(record_id, seq, state, sizes=((4,),)):
    # format 1.4 (torch 2.3): seq_id, no process_group/dtypes/is_p2p
    return {"record_id": record_id, "pg_id": 0, "seq_id": seq, "op_id": seq, "profiling_name": "nccl:all_reduce",
            "time_created_ns": 1000 + seq, "input_sizes": [list(s) for s in sizes],
            "output_sizes": [list(s) for s in sizes], "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed",
            "frames": [{"name": "forward", "filename": "train.py", "line": 10 + seq}]}


def test_format_1x_pickle(tmp_path):
    for rank, entries in {0: [_v1_entry(0, 1, "completed"), _v1_entry(1, 2, "started")],
                          1: [_v1_entry(0, 1, "completed")]}.items():
        dump = {"entries": entries, "version": "1.4", "pg_config": {0: [0, 1]}}
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    v = analyze(load_job([tmp_path])).to_json()
    assert [(c["rank"], c["reason"], c["last_seq"]) for c in v["culprits"]] == [(1, "not_joined", 1)]
    assert v["groups"][0]["ranks"] == [0, 1] and v["groups"][0]["stuck_seq"] == 2
    assert v["groups"][0]["members"][0]["last_started"] == 2


def _v2_entry(record_id, pg, seq, state, sizes=((4,),), dtype="Float"):
    return {"record_id": record_id, "pg_id": pg[2], "process_group": [pg[0], pg[1]], "collective_seq_id": seq,
            "p2p_seq_id": 0, "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": 1000 + record_id,
            "input_sizes": [list(s) for s in sizes], "input_dtypes": [dtype], "output_sizes": [list(s) for s in sizes],
            "output_dtypes": [dtype], "state": state, "time_discovered_started_ns": None,
            "time_discovered_completed_ns": None, "retired": state == "completed", "timeout_ms": 600000,
            "is_p2p": False, "thread_name": "pt_main_thread", "thread_id": "1"}


def test_format_2x_json_with_pg_config_and_missing_rank(tmp_path):
    # an NCCL job, 4 ranks, rank 2's dump absent; pg_status numbers as the JSON writer's strings
    world = ("0", "default_pg", 0)
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}}
    for rank in (0, 1, 3):
        entries = [_v2_entry(0, world, 1, "completed"), _v2_entry(1, world, 2, "started")]
        status = {"0": {"last_enqueued_collective": "2", "last_started_collective": "2",
                        "last_completed_collective": "1"}}
        dump = {"version": "2.10", "comm_lib_version": "2.21.5", "entries": entries, "pg_config": config,
                "pg_status": status}
        (tmp_path / f"nccl_trace_rank_{rank}").write_text(json.dumps(dump))
    v = analyze(load_job([tmp_path])).to_json()
    assert [(c["rank"], c["reason"], c["last_seq"]) for c in v["culprits"]] == [(2, "no_dump", 1)]
    g = v["groups"][0]
    assert g["waiting"] == [0, 1, 3] and g["no_dump"] == [2] and g["stuck_seq"] == 2


def test_dtype_mismatch(tmp_path):
    world = ("0", "default_pg", 0)
    for rank, dtype in ((0, "Float"), (1, "Float"), (2, "BFloat16")):
        entries = [_v2_entry(0, world, 1, "completed"), _v2_entry(1, world, 2, "started", dtype=dtype)]
        (tmp_path / f"dump{rank}.pkl").write_bytes(pickle.dumps({"version": "2.4", "entries": entries,
                                                                  "pg_config": {}}))
    v = analyze(load_job([tmp_path])).to_json()
    assert [(c["rank"], c["reason"]) for c in v["culprits"]] == [(2, "mismatch")]
    assert v["mismatches"][0]["differs_in"] == ["dtypes"] and v["mismatches"][0]["seq"] == 2


def test_garbage_file_is_a_note_not_a_traceback(tmp_path):
    (tmp_path / "nccl_trace_rank_0").write_bytes(b"\x80\x04not a pickle")
    (tmp_path / "nccl_trace_rank_1").write_text('{"hello": 1}')
    assert read_dump(tmp_path / "nccl_trace_rank_0", 0).problem.startswith("unreadable: ")
    done = bprof("hang", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "rank 0: dump unreadable" in done.stdout and "rank 1: dump unreadable" in done.stdout


def test_bad_paths_are_one_line_errors(tmp_path):
    done = bprof("hang", str(tmp_path / "nope"))
    assert done.returncode == 2 and done.stderr.strip() == f"bprof: error: {tmp_path / 'nope'}: no such file or directory"
    done = bprof("hang", str(tmp_path))
    assert done.returncode == 2 and done.stderr.strip() == f"bprof: error: {tmp_path}: no Flight Recorder dumps found"


FAULTHANDLER = """Thread 0x00007f0000000002 (most recent call first):
  File "/x/bprof/profiler/hang_watch.py", line 40 in _serve
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 327 in wait
  File "/job/train.py", line 12 in load_batch
  File "/job/train.py", line 30 in <module>
"""

PYSPY = """Process 123: python train.py
Python v3.11.7 (/usr/bin/python3.11)

Thread 123 (idle): "MainThread"
    wait (threading.py:327)
    load_batch (train.py:12)
    <module> (train.py:30)
Thread 124 (idle): "Thread-1"
    run (threading.py:975)
"""


def test_training_thread_frames():
    assert training_thread_frames(FAULTHANDLER) == [
        "wait (/usr/lib/python3.11/threading.py:327)", "load_batch (/job/train.py:12)", "<module> (/job/train.py:30)"]
    assert training_thread_frames(PYSPY) == ["wait (threading.py:327)", "load_batch (train.py:12)",
                                             "<module> (train.py:30)"]


BLOCK_TORCH = TORCH_BLOCKER + """from bprof.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


def test_hang_runs_without_torch(tmp_path):
    world = ("0", "default_pg", 0)
    for rank in (0, 1):
        entries = [_v2_entry(0, world, 1, "completed")] + ([_v2_entry(1, world, 2, "started")] if rank == 0 else [])
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": entries}))
    done = subprocess.run([sys.executable, "-c", BLOCK_TORCH, "hang", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["culprits"][0]["rank"] == 1
