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


# Not strict: it passed in 1 of 5 runs (straggler 41.6 ms against 60.1 ms of fault and 63.5 ms measured).
@pytest.mark.xfail(strict=False, reason=(
    "a 60 ms slow rank under DDP with one bucket (one all-reduce a step) is priced low or not at all: 5 runs "
    "measured 31.3, 63.5, 46.1, 41.8, 37.0 ms (fault 60.1 ms); bprof said no straggler (lost_ns 0: 4 of 6 steps "
    "gain half the median), 41.6 ms, 29.6 ms, no straggler, 49.9 ms (the what-if saving 57.2). (1) In 2 to 3 of 6 "
    "steps the peer's gloo:all_reduce range (the collective's end as bprof reads it) closes 3-36 ms after its "
    "training thread resumed - after the span's end, or while an op runs - so that exit releases nothing, the "
    "step's end is anchored to the collective's issue and the wait becomes tail work (76.1, 54.7, 45.2 ms); "
    "no-stragglers gives that tail to the slow rank as its peers' median tail: those steps gain -41.5 to -0.7 ms. "
    "(2) The straggler pricing's job step (latest span end - earliest span start, whatif/peers.py) is not the "
    "what-if's (the longest rank's span, whatif/run.py): with the ranks' steps 34.8 ms apart a step gained 30.2 "
    "against 64.8 ms"))
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
