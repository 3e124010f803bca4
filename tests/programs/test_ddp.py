"""DDP with the C++ reducer (tests/programs/ddp_mlp.py: bucketed all-reduces issued from autograd
hooks while backward goes on, waited at its end), a slow rank injected from outside bprof, recorded
for real under torchrun on 2 CPU ranks. The truth is measured: the same program without the fault,
recorded in the same test. bprof must name the slow rank first, price it near the measured
difference, predict a positive no-stragglers step near the clean run's, and hold its invariants.

The margins are wide (this 2-core machine is shared): the tight figures are benchmarks/accuracy.py's.
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.analyzers.recorded import record_script

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).with_name("ddp_mlp.py")
# 8 layers of 512 x 512 in 1 MB buckets: 8 all-reduces a step, the first issued early in backward
CONFIG = ["--steps", "10", "--dim", "512", "--layers", "8", "--bucket-cap-mb", "1"]
SLOW_MS = 60


def _cli(*args) -> dict:
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", *args, "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _measured(tmp_path: Path, name: str, args: list[str]) -> tuple[dict, dict]:
    db = record_script(tmp_path, name, PROGRAM, [*CONFIG, *args], steps="3:9")
    return _cli("analyze", "--db", str(db)), _cli("whatif", "--db", str(db), "-s", "no-stragglers")


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    analysis, _ = _measured(tmp_path_factory.mktemp("clean"), "clean", [])
    return analysis


@pytest.mark.parametrize("where,extra", [("before", []), ("hook", ["--grad-as-bucket-view"])])
def test_a_slow_ddp_rank_is_priced_at_what_removing_it_buys(tmp_path, clean, where, extra):
    analysis, whatif = _measured(tmp_path, f"slow_{where}", ["--slow-rank", "1", "--slow-ms", str(SLOW_MS),
                                                             "--slow-where", where, *extra])
    clean_ns = clean["metrics"]["step_time_ns"]["value"]
    slow_ns = analysis["metrics"]["step_time_ns"]["value"]
    truth_ns = slow_ns - clean_ns
    ranked = [f for f in analysis["findings"] if f["lost_ns"] is not None]
    top = ranked[0]
    predicted = whatif["scenarios"][1]
    print(f"{where}: clean {clean_ns / 1e6:.1f} ms, slow {slow_ns / 1e6:.1f} ms, truth {truth_ns / 1e6:.1f} ms; "
          f"straggler {top['lost_ns'] / 1e6:.1f} ms; no-stragglers predicts {predicted['predicted_step_ns'] / 1e6:.1f} ms")
    assert top["analyzer"] == "stragglers" and top["evidence"]["ranks"] == [1], ranked[:3]
    # against the fault as it really ran (its range in the trace; load stretches it), and against the
    # measured difference of the two runs (load also stretches the clean run: a wider margin)
    con = duckdb.connect(str(tmp_path / f"slow_{where}.duckdb"), read_only=True)
    ran_ns = statistics.median(ns for (ns,) in con.execute(
        "SELECT sum(dur_ns) FROM events WHERE rank = 1 AND name = 'fault/slow_rank' AND step IS NOT NULL GROUP BY step").fetchall())
    con.close()
    print(f"{where}: the fault ran {ran_ns / 1e6:.1f} ms per step")
    assert top["lost_ns"] == pytest.approx(ran_ns, rel=0.35)
    assert top["lost_ns"] == pytest.approx(truth_ns, rel=0.5)
    # invariants: no finding above its rank's step; the prediction positive, near the clean run
    steps = {r["rank"]: r["median_step_ns"] for r in analysis["ranks"]}
    assert all(f["lost_ns"] <= max(steps.values()) for f in ranked)
    assert predicted["withheld"] is None and whatif["scenarios"][0]["max_error_frac"] < 0.01
    # positive, shorter than the faulted step, and not below what the clean run needs: transfers stay
    # as measured in the faulted run, and under load they are slower there (gloo's workers contend
    # with the slow rank's loop), so the prediction may lie above the clean run, never far below it
    assert 0.3 * clean_ns < predicted["predicted_step_ns"] < slow_ns
    # the what-if and the finding come from one engine: they agree
    # (not to the nanosecond: the straggler pricing takes its median over the steps it prices, the
    # what-if over every analysed step; seen 65.5 against 66.3 ms)
    assert predicted["saved_ns"] == pytest.approx(top["lost_ns"], rel=0.05)
