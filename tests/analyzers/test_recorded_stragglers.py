"""A real straggler: examples/train_gpt.py with --slow-rank under bprof record (torchrun, 2 CPU
ranks, gloo). The straggler finding must name the slow rank, call it a device/compute cause, and
price it close to the extra compute the rank really ran."""

import json
import statistics
import subprocess
import sys

import duckdb
import pytest

from tests.profiler.test_record import TRAINER, record

pytestmark = pytest.mark.slow
# 300 ms against ~150 ms of regular compute per step: the peers' own compute varies by +-40 ms per
# step on this shared 2-core machine (measured), which at 150 ms put the cost 27% off in one run of
# three; six steps, not four, so one contended step cannot decide the median.
SLOW_RANK, SLOW_MS = 1, 300


def test_slow_rank_is_the_straggler_with_its_cost(tmp_path):
    args = ["--tp", "1", "--dp", "2", "--steps", "10", "--slow-rank", str(SLOW_RANK), "--slow-ms", str(SLOW_MS)]
    done = record(tmp_path, "--steps", "3:9", "--name", "slow", nproc=2, script=TRAINER, script_args=args)
    assert done.returncode == 0, done.stderr[-3000:]
    out = subprocess.run([sys.executable, "-m", "bprof.cli.main", "analyze", "--db", str(tmp_path / "s.duckdb"), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    stragglers = [f for f in json.loads(out.stdout)["findings"] if f["analyzer"] == "stragglers"]
    assert stragglers, json.loads(out.stdout)["findings"]
    top = stragglers[0]
    assert top["evidence"]["ranks"] == [SLOW_RANK] and top["evidence"]["cause"] == "device"
    # The trainer aims its extra compute at SLOW_MS, but on a shared 2-core machine the loop's real
    # length drifts (seen: 100-330 ms for 150); the cost is checked against what the rank really ran.
    con = duckdb.connect(str(tmp_path / "s.duckdb"), read_only=True)
    ran_ns = statistics.median(ns for (ns,) in con.execute(
        "SELECT sum(dur_ns) FROM events WHERE rank = ? AND name = 'bprof/slow_rank' AND step IS NOT NULL GROUP BY step",
        [SLOW_RANK]).fetchall())
    # The price is what the replay says: the slow rank working like its peer. Here the peer computes
    # while the slow loop runs, on a shared 2-core machine, so the peer's own compute is inflated by
    # the contention the loop causes (seen in CI: lost 242 ms against a 325 ms loop, the peer 80 ms
    # slower that step). So the price must match the slow rank's measured extra compute over its peer
    # within 25 %; against the loop itself it may fall short by what contention added to the peer
    # (302.6 against 304.7 ms on a quiet machine; 177 against 305 ms beside a busy loop and another
    # recording), never exceed it by more than 25 %, and stay above a quarter of it.
    compute = dict(con.execute("SELECT rank, compute_ns FROM stragglers_ranks").fetchall())
    extra_ns = compute[SLOW_RANK] - compute[1 - SLOW_RANK]
    print(f"straggler lost {top['lost_ns'] / 1e6:.1f} ms per step; slow loop ran {ran_ns / 1e6:.1f} ms (asked {SLOW_MS}); "
          f"extra compute over its peer {extra_ns / 1e6:.1f} ms")
    assert top["lost_ns"] == pytest.approx(extra_ns, rel=0.25)
    assert 0.25 * ran_ns < top["lost_ns"] < 1.25 * ran_ns
