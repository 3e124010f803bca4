"""torch.distributed.pipelining (tests/programs/pipe.py: an MLP cut into 2 PipelineStages, one per
rank, run by ScheduleGPipe or Schedule1F1B over 4 micro-batches), one heavy stage injected from
outside bprof (stage 1 computes 15 ms more in each micro-batch's forward), recorded for real under
torchrun on 2 CPU ranks (gloo). The truth is measured: the same program without the fault, recorded
in the same test. bprof must name stage 1's rank first (stage imbalance, or a straggler), price it
near the measured difference and near the fault's own duration, predict a positive balanced-stages
step below the faulted one, and hold its invariants.

The margins are wide (this 2-core machine is shared): the tight figures are benchmarks/accuracy.py's.
"""

from pathlib import Path

import pytest

from tests.programs.measured import assert_invariants, record, summary

pytestmark = pytest.mark.slow
PROGRAM = Path(__file__).with_name("pipe.py")
# 8 layers of 256 x 256 (4 a stage), a batch of 32 in 4 micro-batches: 8 sends and 8 recvs a step on each rank
CONFIG = ["--steps", "10", "--dim", "256", "--layers", "8", "--batch", "32", "--microbatches", "4"]
HEAVY_MS = 15  # per micro-batch: 60 ms a step
SCENARIOS = ("no-stragglers", "balanced-stages")


@pytest.fixture(scope="module")
def recordings(tmp_path_factory):
    """schedule -> (clean, heavy), recorded one after the other, lazily."""
    done = {}

    def get(schedule):
        if schedule not in done:
            args = [*CONFIG, "--schedule", schedule]
            clean = record(tmp_path_factory.mktemp(f"clean_{schedule}"), f"clean_{schedule}", PROGRAM, args,
                           scenarios=SCENARIOS)
            heavy = record(tmp_path_factory.mktemp(f"heavy_{schedule}"), f"heavy_{schedule}", PROGRAM,
                           [*args, "--heavy-stage", "1", "--heavy-ms", str(HEAVY_MS)], scenarios=SCENARIOS)
            done[schedule] = clean, heavy
        return done[schedule]
    return get


def _names_stage_1(finding: dict) -> bool:
    imbalance = finding["analyzer"] == "bubbles" and finding["title"].startswith("Stage imbalance")
    return (imbalance or finding["analyzer"] == "stragglers") and finding["evidence"]["ranks"] == [1]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_one_heavy_pipeline_stage_is_priced_at_what_balancing_it_buys(recordings, schedule):
    clean, heavy = recordings(schedule)
    truth_ns = heavy.step_ns - clean.step_ns
    [imbalance] = [f for f in heavy.ranked if f["analyzer"] == "bubbles" and f["title"].startswith("Stage imbalance")]
    predicted = heavy.scenario("balanced-stages")
    ran_ns = heavy.fault_ns(1, "fault/heavy_stage")
    print(summary(f"pipelining {schedule}, heavy stage 1", clean, heavy), f"; the fault ran {ran_ns / 1e6:.1f} ms per step; "
          f"stage imbalance {imbalance['lost_ns'] / 1e6:.1f} ms, balanced-stages saves {predicted['saved_ns'] / 1e6:.1f} ms")
    assert imbalance["evidence"]["ranks"] == [1], heavy.ranked[:3]
    assert imbalance["lost_ns"] == pytest.approx(ran_ns, rel=0.35)
    assert imbalance["lost_ns"] == pytest.approx(truth_ns, rel=0.5)
    assert_invariants(heavy)
    assert_invariants(clean)
    assert 0.5 * clean.step_ns < predicted["predicted_step_ns"] < heavy.step_ns


# Before the imbalance was priced by the engine and the bubble became its unpriced symptom, GPipe's
# bubble finding (a modelled ideal that also removes gloo's send/recv time) ranked above the stage
# imbalance in 2 of 6 runs (94.3 against 73.7 ms), and the imbalance's flow-shop model and the
# balanced-stages what-if disagreed by 5-15 % in 4 of 6 (60.0 against 65.7 ms).


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_the_heavy_stage_is_the_first_cause(recordings, schedule):
    _, heavy = recordings(schedule)
    assert _names_stage_1(heavy.ranked[0]), heavy.ranked[:3]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_the_stage_imbalance_finding_and_the_balanced_stages_what_if_agree(recordings, schedule):
    _, heavy = recordings(schedule)
    [imbalance] = [f for f in heavy.ranked if f["analyzer"] == "bubbles" and f["title"].startswith("Stage imbalance")]
    predicted = heavy.scenario("balanced-stages")
    # one engine prices both: the same number
    assert predicted["saved_ns"] == imbalance["lost_ns"]
