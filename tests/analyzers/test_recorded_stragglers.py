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
    print(f"straggler lost {top['lost_ns'] / 1e6:.1f} ms per step; slow loop ran {ran_ns / 1e6:.1f} ms (asked {SLOW_MS})")
    assert top["lost_ns"] == pytest.approx(ran_ns, rel=0.25)
