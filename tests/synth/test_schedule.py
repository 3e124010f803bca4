"""Pipeline schedules: every microbatch once, neighbours agree on their p2p order, bubbles."""

from __future__ import annotations

import pytest

from bprof.synth import Scenario
from bprof.synth.schedule import bubble_frac, stage_actions
from bprof.synth.truth import step_stats
from bprof.synth.writer import simulate_run


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("stages,microbatches", [(2, 1), (2, 4), (3, 2), (4, 3), (4, 8)])
def test_each_stage_runs_every_microbatch_and_neighbours_pair_their_p2p(schedule, stages,
                                                                        microbatches):
    acts = [stage_actions(schedule, s, stages, microbatches) for s in range(stages)]
    for a in acts:
        assert sorted(mb for k, mb in a if k == "F") == list(range(microbatches))
        assert sorted(mb for k, mb in a if k == "B") == list(range(microbatches))
        for mb in range(microbatches):
            assert a.index(("F", mb)) < a.index(("B", mb))
    for s in range(stages - 1):
        # On the link s <-> s+1 both sides must post the matching calls in the same order.
        down = [(k, mb) for k, mb in acts[s] if k in ("send_f", "recv_b")]
        up = [({"recv_f": "send_f", "send_b": "recv_b"}[k], mb) for k, mb in acts[s + 1]
              if k in ("recv_f", "send_b")]
        assert down == up


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("microbatches", [3, 8])
def test_balanced_pipeline_idles_about_the_theoretical_bubble(schedule, microbatches):
    """With equal stages (small vocabulary), idle GPU time ~ (p-1)/(m+p-1) of the step."""
    sc = Scenario(tp=1, pp=4, dp=1, steps=2, layers=8, microbatches=microbatches,
                  schedule=schedule, hidden=2048, heads=16, vocab=2048, seed=1)
    _, progs, insts = simulate_run(sc)
    theory = bubble_frac(schedule, 4, microbatches)
    for st in step_stats(progs, insts):
        idle = 1 - st["compute"][1] / st["dur"][1]
        assert 0.8 * theory < idle < theory + 0.08
