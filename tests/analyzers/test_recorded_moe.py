"""Expert imbalance on a real MoE token dispatch: tests/analyzers/moe_dispatch.py under `bprof record`
(torchrun, 2 CPU ranks, gloo), its uneven all_to_all_single calls matched across ranks and priced by
collperf. With --skew 3, expert 0 receives 3 tokens for every 1 the other expert gets in the
dispatch, and sends them back in the combine: per rank 1,536 against 512 tokens, 1.50x the mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.analyzers.recorded import analysed, record_script

SCRIPT = Path(__file__).resolve().parent / "moe_dispatch.py"


def record_moe(out: Path, name: str, skew: float) -> Path:
    return record_script(out, name, SCRIPT, ["--skew", str(skew)])


@pytest.fixture(scope="module")
def moe_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("moe")
    return {skew: analysed(record_moe(out, f"moe{skew}", skew), ["match", "clock", "collperf"]) for skew in (1, 3)}


def test_uneven_dispatch_and_combine_are_an_expert_imbalance_finding(moe_runs):
    con, run_id = moe_runs[3]
    calls = con.execute("""SELECT rank, in_elems, out_elems FROM collectives WHERE run_id = ? AND op = 'all_to_all' AND step = 3
                           ORDER BY rank, call_index""", [run_id]).fetchall()
    # dispatch then combine per step: rank 0 (expert 0) receives 1536 tokens x 64, then sends them back
    assert calls == [(0, 65536, 98304), (0, 98304, 65536), (1, 65536, 32768), (1, 32768, 65536)]
    fracs = [f for (f,) in con.execute("""SELECT member_bytes_imbalance_frac FROM collperf_instances
                                          WHERE run_id = ? AND op = 'all_to_all'""", [run_id]).fetchall()]
    assert len(fracs) == 6 and all(f == pytest.approx(1 / 3) for f in fracs)
    [(title, lost, evidence)] = con.execute("""SELECT title, lost_ns, evidence FROM findings
                                               WHERE run_id = ? AND title LIKE 'Expert imbalance%'""", [run_id]).fetchall()
    assert "1.50x the mean" in title and lost > 0 and '"ranks": [0, 1]' in evidence


def test_balanced_dispatch_flags_nothing(moe_runs):
    con, run_id = moe_runs[1]
    assert con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND title LIKE 'Expert imbalance%'",
                       [run_id]).fetchone()[0] == 0
    assert {f for (f,) in con.execute("""SELECT member_bytes_imbalance_frac FROM collperf_instances
                                         WHERE run_id = ? AND op = 'all_to_all'""", [run_id]).fetchall()} == {0.0}
