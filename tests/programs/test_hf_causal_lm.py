"""A Hugging Face Transformers GPT-2 (tests/programs/hf_causal_lm.py: tiny config, random weights)
under DDP, a slow rank injected from outside bprof, recorded for real under torchrun on 2 CPU ranks
(gloo). The truth is measured: the same program without the fault, recorded in the same test. bprof
must name the slow rank first, price it near the measured difference and near the fault's own
duration, predict a positive no-stragglers step below the faulted one, and hold its invariants.

The margins are wide (this 2-core machine is shared): the tight figures are benchmarks/accuracy.py's.
"""

from pathlib import Path

import pytest

from tests.programs.measured import assert_invariants, record, summary

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e .[test])")
# It once ran only when asked (BPROF_HF_TESTS=1): 2 of about 7 recordings hung. The hang is torch's,
# not bprof's (a plain torchrun run hung too: DDP's reducer, freed last, joined gloo's workers holding
# the GIL while one of them waited for it); the program now tears down around it (hf_causal_lm.py).
pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).with_name("hf_causal_lm.py")
# 2 layers, 64 wide, a vocabulary of 1000, 4 x 64 tokens: DDP's default 25 MB bucket holds it all
CONFIG = ["--steps", "10", "--layers", "2", "--embd", "64", "--vocab", "1000", "--batch", "4", "--seq", "64"]
SLOW_MS = 60


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    return record(tmp_path_factory.mktemp("clean"), "clean", PROGRAM, CONFIG)


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    return record(tmp_path_factory.mktemp("slow"), "slow", PROGRAM, [*CONFIG, "--slow-rank", "1", "--slow-ms", str(SLOW_MS)])


def test_a_hugging_face_model_under_ddp_is_recorded_and_analysed_within_the_invariants(clean, slow):
    for rec in (clean, slow):
        assert {r["rank"] for r in rec.analysis["ranks"]} == {0, 1}
        assert_invariants(rec)


# Not strict. Since the what-if's job step counts the straggler price's gain (the job's window) and a
# gloo range closing after its training thread resumed ends at the resumption (bprof/whatif/host.sql),
# two runs (2026-12-03) priced 82.8 and 62.8 ms against 88.7 and 71.4 measured, and predicted 39.0
# and 25.0 ms against 35.4 and 16.5 clean. The first failed (passed the second): its price is above the
# fault itself (60.1 ms) - on 2 cores the fault also costs its peer's gloo thread its core - beyond
# the `ran_ns` bound. Earlier runs: priced 0-49.9 ms against 31-64 ms.
@pytest.mark.xfail(strict=False, reason=(
    "the measured cost of the 60 ms fault (88.7 ms in one run, 31-64 ms in earlier ones) and bprof's price "
    "(82.8 ms) exceed the fault's own duration on this 2-core machine, beyond the test's 35% bound on it; "
    "two runs since the fix (one passed), not enough to drop the xfail"))
def test_a_slow_rank_of_a_hugging_face_model_under_ddp_is_priced_at_what_removing_it_buys(clean, slow):
    truth_ns = slow.step_ns - clean.step_ns
    top, predicted = slow.ranked[0], slow.no_stragglers
    ran_ns = slow.fault_ns(1, "fault/slow_rank")
    print(summary("hf gpt2 ddp, slow before forward", clean, slow), f"; the fault ran {ran_ns / 1e6:.1f} ms per step")
    assert top["analyzer"] == "stragglers" and top["evidence"]["ranks"] == [1], slow.ranked[:3]
    assert top["lost_ns"] == pytest.approx(ran_ns, rel=0.35)
    assert top["lost_ns"] == pytest.approx(truth_ns, rel=0.5)
    # transfers stay as measured in the faulted run, where the slow rank's peer is already waiting when
    # it arrives: the prediction may lie below the clean run, not far
    assert 0.5 * clean.step_ns < predicted["predicted_step_ns"] < slow.step_ns
    assert predicted["saved_ns"] == pytest.approx(top["lost_ns"], rel=0.05)
