"""`bprof record` end to end: real torchrun on CPU ranks (gloo), the real store."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tests.conftest import upstream_exit_abort

ROOT = Path(__file__).resolve().parents[2]
TOY = Path(__file__).with_name("toy_train.py")
TRAINER = ROOT / "examples" / "train_gpt.py"
pytestmark = pytest.mark.slow


def record(tmp_path, *args, nproc=None, script=TOY, script_args=(), timeout=300, env=None):
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] if nproc else [sys.executable]
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(tmp_path / "run"), "--db", str(tmp_path / "s.duckdb"),
           *args, "--", *launcher, str(script), *script_args]
    for attempt in range(2):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                              env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
        if attempt or not upstream_exit_abort(done):
            return done
        shutil.rmtree(tmp_path / "run", ignore_errors=True)  # start over: a torch abort at exit, not bprof
        (tmp_path / "s.duckdb").unlink(missing_ok=True)


def store(tmp_path):
    return duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)


def assert_collectives_matched(con, run_id):
    """Every collective has group and sequence number; each instance has every member, one op, one size."""
    assert con.execute("SELECT count(*) FROM collectives WHERE run_id = ? AND NOT is_p2p AND seq IS NULL",
                       [run_id]).fetchone()[0] == 0
    bad = con.execute("""
        SELECT pg_name, seq, count(*), any_value(group_size), count(DISTINCT op), count(DISTINCT in_bytes)
        FROM collectives WHERE run_id = ? AND NOT is_p2p GROUP BY pg_name, seq
        HAVING count(*) <> any_value(group_size) OR count(DISTINCT op) > 1 OR count(DISTINCT in_bytes) > 1""",
        [run_id]).fetchall()
    assert bad == []


def test_train_gpt_tp2_dp2_every_rank_every_collective_and_metadata(tmp_path):
    done = record(tmp_path, "--steps", "2:4", "--name", "tp2dp2", nproc=4, script=TRAINER,
                  script_args=["--tp", "2", "--dp", "2", "--steps", "5"])
    assert done.returncode == 0, done.stderr[-3000:]
    con = store(tmp_path)
    run_id, model_flops, missing, command = con.execute(
        "SELECT run_id, model_flops_per_step, missing_ranks, command FROM runs WHERE name = 'tp2dp2'").fetchone()
    assert missing == [] and "train_gpt.py" in command
    assert con.execute("SELECT list(DISTINCT step ORDER BY step) FROM steps WHERE run_id = ?", [run_id]).fetchone()[0] == [2, 3]
    assert con.execute("SELECT count(DISTINCT rank) FROM steps WHERE run_id = ?", [run_id]).fetchone()[0] == 4
    descs = {r[0] for r in con.execute("SELECT DISTINCT pg_desc FROM collectives WHERE run_id = ?", [run_id]).fetchall()}
    assert descs == {"TENSOR_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP"}
    assert_collectives_matched(con, run_id)
    printed = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("bprof-model: "))[13:])
    assert model_flops == printed["model_flops_per_step"]
    metas = [json.loads((tmp_path / "run" / "meta" / f"rank{r}.json").read_text()) for r in range(4)]
    assert len({m["run_id"] for m in metas}) == 1
    for r, m in enumerate(metas):
        assert (m["rank"], m["world_size"], m["local_rank"]) == (r, 4, r)
        assert m["host"] and m["pid"] > 0 and m["torch_version"].startswith("2.") and m["intra_op_threads"] >= 1
        assert {g["pg_desc"] for g in m["process_groups"]} >= {"TENSOR_MODEL_PARALLEL_GROUP", "DATA_PARALLEL_GROUP",
                                                               "PIPELINE_MODEL_PARALLEL_GROUP"}
        assert m["windows_captured"][0]["window"] == "2:4" and m["windows_captured"][0]["flight_recorder_entries"] > 0
        assert m["model"]["executed_flops_per_step"] >= m["model"]["model_flops_per_step"] > 0
    assert "bprof: recorded ranks 0-3" in done.stderr and "ingested run" in done.stderr


def test_train_gpt_pp2_dp2_send_recv_pairs_match(tmp_path):
    done = record(tmp_path, "--steps", "2:3", nproc=4, script=TRAINER, script_args=["--pp", "2", "--dp", "2", "--steps", "4"])
    assert done.returncode == 0, done.stderr[-3000:]
    con = store(tmp_path)
    sends, recvs, paired = con.execute("""
        SELECT (SELECT count(*) FROM collectives WHERE op = 'send'), (SELECT count(*) FROM collectives WHERE op = 'recv'),
               (SELECT count(*) FROM collectives s JOIN collectives r
                  ON s.op = 'send' AND r.op = 'recv' AND s.peer_rank = r.rank AND r.peer_rank = s.rank
                 AND s.pg_name = r.pg_name AND s.seq = r.seq AND s.in_bytes = r.in_bytes)""").fetchone()
    assert sends == recvs == paired > 0
    assert con.execute("SELECT DISTINCT pg_desc FROM collectives WHERE is_p2p").fetchall() == [("PIPELINE_MODEL_PARALLEL_GROUP",)]
    assert_collectives_matched(con, 1)


def test_ddp_cpp_buckets_two_windows_and_exit_code(tmp_path):
    done = record(tmp_path, "--steps", "2:3,5:7", nproc=2, script_args=["--steps", "8", "--exit-code", "3"])
    # the child is torchrun: a worker exiting with 3 makes torchrun exit with 1, and bprof with torchrun
    assert done.returncode == 1 and "exitcode: 3" in done.stderr, done.stderr[-3000:]
    con = store(tmp_path)
    runs = con.execute("SELECT run_id, name FROM runs ORDER BY run_id").fetchall()
    assert [name for _, name in runs] == ["run-iteration_2", "run-iteration_5"]
    for (run_id, _), steps in zip(runs, ([2], [5, 6])):
        assert con.execute("SELECT list(DISTINCT step ORDER BY step) FROM steps WHERE run_id = ?", [run_id]).fetchone()[0] == steps
        # DDP's bucket all-reduces are issued from C++, yet each has its group and sequence number
        buckets = con.execute("SELECT count(*) FROM collectives WHERE run_id = ? AND op = 'all_reduce' AND pg_desc = 'default_pg'",
                              [run_id]).fetchone()[0]
        assert buckets >= 2 * len(steps) * 2  # several buckets per step, on both ranks
        assert_collectives_matched(con, run_id)


def test_adjacent_windows_both_recorded(tmp_path):
    # 2:4,4:6 stops one profiler session and starts the next at the same optimizer step: inside its
    # Optimizer.step range, this killed the rank in the garbage collector at the second window's end
    # (3 of 3 runs); the next session now starts once the step has returned
    done = record(tmp_path, "--steps", "2:4,4:6", nproc=2, env={"PYTHONFAULTHANDLER": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    con = store(tmp_path)
    per_run = con.execute("""SELECT r.name, s.rank, list(s.step ORDER BY s.step) FROM steps s JOIN runs r USING (run_id)
                             GROUP BY ALL ORDER BY ALL""").fetchall()
    assert per_run == [("run-iteration_2", 0, [2, 3]), ("run-iteration_2", 1, [2, 3]),
                       ("run-iteration_4", 0, [4, 5]), ("run-iteration_4", 1, [4, 5])]
    for (run_id,) in con.execute("SELECT run_id FROM runs").fetchall():
        assert_collectives_matched(con, run_id)


def test_killed_rank_leaves_a_partial_run(tmp_path):
    done = record(tmp_path, "--steps", "2:6", nproc=2, script_args=["--steps", "8", "--kill-rank", "1", "--kill-at", "4"])
    assert done.returncode != 0
    con = store(tmp_path)
    assert con.execute("SELECT num_ranks_ingested, missing_ranks FROM runs").fetchone() == (1, [1])
    meta = json.loads((tmp_path / "run" / "meta" / "rank0.json").read_text())
    assert meta["windows_captured"][0]["partial"] is True
    assert "partial run; missing ranks 1" in done.stderr


def test_sigusr1_captures_the_next_steps_of_a_running_job(tmp_path):
    cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(tmp_path / "run"), "--db", str(tmp_path / "s.duckdb"),
           "--steps", "1000:1001", "--", sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node=2", str(TOY), "--steps", "60", "--sleep-ms", "100",
           "--ready-file", str(tmp_path / "ready")]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while not (tmp_path / "ready").exists() and time.time() < deadline:  # the job is training
        time.sleep(0.2)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    windows = sorted(p.name for p in (tmp_path / "run" / "traces").iterdir())
    assert len(windows) == 1 and int(windows[0].split("_")[1]) % 8 == 0
    con = store(tmp_path)
    assert con.execute("SELECT count(DISTINCT step), count(DISTINCT rank) FROM steps").fetchone() == (3, 2)


def test_a_script_with_its_own_profiler_still_runs(tmp_path):
    done = record(tmp_path, "--steps", "2:4", nproc=2, script_args=["--steps", "6", "--own-profiler", "1:5"],
                  env={"OWN_TRACE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "own_rank0.json").exists() and (tmp_path / "own_rank1.json").exists()
    assert "bprof steps aside" in done.stderr
    assert "nothing was captured" in done.stderr
    notes = json.loads((tmp_path / "run" / "meta" / "rank0.json").read_text())["notes"]
    assert any("stepped aside" in n for n in notes)


def test_plain_python_with_explicit_steps(tmp_path):
    done = record(tmp_path, "--steps", "2:4", script_args=["--steps", "6", "--no-optimizer"])
    assert done.returncode == 0, done.stderr[-3000:]
    con = store(tmp_path)
    assert con.execute("SELECT rank, list(step ORDER BY step) FROM steps GROUP BY rank").fetchall() == [(0, [2, 3])]


def test_failure_before_the_window_says_nothing_was_captured(tmp_path):
    done = record(tmp_path, "--steps", "50:52", script_args=["--steps", "3", "--exit-code", "5"])
    assert done.returncode == 5
    assert "nothing was captured" in done.stderr and "exited with 5" in done.stderr


def record_two_hosts(tmp_path, script, script_args, *, shift_ns: int) -> None:
    """Two torchrun --nnodes=2 agents on localhost, each under its own bprof record (--steps 2:4), the
    second posing as host "fakehost-b" with a clock shift_ns ahead (the recorder's test-only variables);
    then both directories ingested into tmp_path/s.duckdb as one run."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for node, extra in ((0, {}), (1, {"BPROF_HOSTNAME": "fakehost-b", "BPROF_TEST_CLOCK_SHIFT_NS": str(shift_ns)})):
        cmd = [sys.executable, "-m", "bprof.cli.main", "record", "--out", str(tmp_path / f"host{node}"), "--no-ingest",
               "--steps", "2:4", "--", sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={node}",
               "--nproc_per_node=2", "--master_addr=127.0.0.1", f"--master_port={port}", str(script), *script_args]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                      env={**os.environ, "OMP_NUM_THREADS": "1", **extra}))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", "ingest", str(tmp_path / "host0"), str(tmp_path / "host1"),
                           "--db", str(tmp_path / "s.duckdb")], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


def test_two_hosts_on_localhost_make_one_run_with_clock_samples(tmp_path):
    """Two torchrun --nnodes=2 agents, each under its own bprof record; the second "host" has
    another host name and a clock 5 s ahead (test-only variables of the recorder)."""
    shift_ns = 5_000_000_000
    record_two_hosts(tmp_path, TOY, ["--steps", "6"], shift_ns=shift_ns)
    con = store(tmp_path)
    assert con.execute("SELECT count(*), bool_and(consistent), any_value(missing_ranks) FROM runs").fetchone() == (1, True, [])
    hosts = con.execute("SELECT rank, host FROM ranks ORDER BY rank").fetchall()
    assert [h for _, h in hosts][2:] == ["fakehost-b", "fakehost-b"] and hosts[0][1] == hosts[1][1] != "fakehost-b"
    metas = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("host*/meta/rank*.json"))]
    assert len({m["run_id"] for m in metas}) == 1  # the job took rank 0's id, through the store
    rows = con.execute("""SELECT rank, reference_rank, phase, count(*),
                                 median(reference_ns - (send_ns + recv_ns) / 2), max(recv_ns - send_ns)
                          FROM clock_samples GROUP BY ALL ORDER BY phase""").fetchall()
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(2, 0, "end:2:4", 16), (2, 0, "start:2:4", 16)]
    for *_, offset_ns, worst_rtt_ns in rows:
        assert abs(offset_ns + shift_ns) < max(worst_rtt_ns, 50_000_000)  # the reference is 5 s behind host b
    # the shifted host's steps really are 5 s later on its own clock
    lag = con.execute("SELECT max(ts_ns) FILTER (WHERE rank = 2) - max(ts_ns) FILTER (WHERE rank = 0) FROM steps WHERE step = 2").fetchone()[0]
    assert abs(lag - shift_ns) < 1_000_000_000


def test_window_contents_gc_pauses_annotations_memory_and_execution_trace(tmp_path):
    done = record(tmp_path, "--steps", "2:4", "--memory", "--execution-trace",
                  script_args=["--steps", "5", "--gc", "--annotate"])
    assert done.returncode == 0, done.stderr[-3000:]
    con = store(tmp_path)
    names = dict(con.execute("""SELECT name, count(*) FROM events
                                WHERE name IN ('bprof/gc.gen2', 'toy/forward', '[memory]') GROUP BY name""").fetchall())
    assert names.get("bprof/gc.gen2", 0) >= 2 and names.get("toy/forward") == 2 and names.get("[memory]", 0) > 0
    with gzip.open(tmp_path / "run" / "traces" / "iteration_2" / "rank0.et.json.gz", "rt") as f:
        et = json.load(f)  # complete when the window stops, packed
    assert et["nodes"] and "schema" in et
    assert con.execute("SELECT count(*) FROM exec_nodes").fetchone()[0] == len(et["nodes"])


def test_injected_hook_imports_nothing_heavy_and_stays_inert_without_torch(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import sys\nprint('heavy:', sorted(m for m in ('torch', 'duckdb', 'numpy', 'pandas') if m in sys.modules))\n")
    done = record(tmp_path, "--steps", "2:4", script=probe)
    assert "heavy: []" in done.stdout
    assert done.returncode == 0 and "nothing was captured" in done.stderr
