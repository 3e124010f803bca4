"""`microbatches=M` on an interleaved 1F1B pipeline: Megatron's chunk order, the theory's step for
equal stages, and the engine's replay against an inline list-scheduling simulation of the same
schedule (random stage times, transfers and offsets) at the measured m and at other counts. Exact
at M = m on a real recording: tests/analyzers/test_bubbles_interleaved.py."""

import numpy as np
import pytest

from bprof.errors import UsageError
from bprof.whatif.pipeline import Pipeline, StageTimes, interleaved_order, interleaved_step_ns, stage_ends
from bprof.whatif.scenarios import MicroBatches

IL = "interleaved-1f1b"


def simulate(t: StageTimes, microbatches: int) -> np.ndarray:
    """Each stage's end (ns after the earliest start, without post_ns, as stage_ends) when it runs
    interleaved_order's items one after the other from start + pre; an item that needs a
    neighbour's output starts once that output is computed and the stage is free, plus the stage's
    transfer; sends cost nothing."""
    p, v = len(t.pre_ns), t.chunks
    todo = [interleaved_order(s, p, microbatches, v) for s in range(p)]
    free = [int(t.start_ns[s] + t.pre_ns[s]) for s in range(p)]
    done: dict[tuple[str, int, int], int] = {}  # (F|B, micro-batch, model chunk) -> end of its compute
    while any(todo):
        progressed = False
        for s in range(p):
            while todo[s]:
                kind, k, c = todo[s][0]
                chunk = c * p + s
                src = chunk - 1 if kind == "F" else chunk + 1
                start = free[s]
                if 0 <= src < p * v:
                    if (kind, k, src) not in done:
                        break
                    start = max(start, done[kind, k, src]) + int(t.transfer_ns[s])
                free[s] = start + int(t.forward_ns[s] if kind == "F" else t.backward_ns[s])
                done[kind, k, chunk] = free[s]
                todo[s].pop(0)
                progressed = True
        assert progressed, "deadlock"
    return np.array(free) - int(t.start_ns.min())


def test_megatron_order_two_stages_two_chunks():
    # p=2, v=2, m=4: stage 0 warms up (2-0-1)*2 + (2-1)*2 = 4 forwards: micro-batches 0, 1 on chunk 0, then
    # 0, 1 on chunk 1; backwards start on its last chunk (model chunk 2)
    assert interleaved_order(0, 2, 4, 2) == [
        ("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1),
        ("F", 2, 0), ("B", 0, 1), ("F", 3, 0), ("B", 1, 1), ("F", 2, 1), ("B", 0, 0), ("F", 3, 1), ("B", 1, 0),
        ("B", 2, 1), ("B", 3, 1), ("B", 2, 0), ("B", 3, 0)]
    # the last stage warms up (v-1)*p = 2 forwards
    assert interleaved_order(1, 2, 4, 2)[:4] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1)]
    # m = p: every forward first, as Megatron does
    assert [kind for kind, _, _ in interleaved_order(0, 2, 2, 2)] == ["F"] * 4 + ["B"] * 4


@pytest.mark.parametrize("p, v, m", [(2, 2, 4), (2, 2, 2), (4, 2, 8), (4, 2, 4), (3, 3, 6), (2, 4, 6)])
def test_equal_stages_take_v_m_plus_p_minus_1_chunks(p, v, m):
    # forward 100, backward 200 ns per chunk, free transfers: the first stage ends after (v*m + p - 1)
    # chunks of F + B: the (p-1)/(v*m+p-1) bubble of the theory
    zero = np.zeros(p, dtype=np.int64)
    t = StageTimes(zero, zero, np.full(p, 100), np.full(p, 200), zero, zero, v)
    ends = stage_ends(t, IL, m)
    assert ends[0] == (v * m + p - 1) * 300
    assert ends.tolist() == simulate(t, m).tolist()
    assert interleaved_step_ns(np.full(p, 100), m, v) == (v * m + p - 1) * 300


@pytest.mark.parametrize("p, v, measured, target", [(2, 2, 4, 8), (2, 2, 8, 4), (4, 2, 4, 8), (3, 2, 6, 3), (2, 3, 4, 2)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_replay_matches_the_simulation_at_the_measured_and_another_count(p, v, measured, target, seed):
    rng = np.random.default_rng(seed)
    t = StageTimes(rng.integers(0, 50, p), rng.integers(0, 80, p), rng.integers(50, 150, p), rng.integers(100, 300, p),
                   rng.integers(0, 30, p), np.zeros(p, dtype=np.int64), v)
    at_m, at_target = stage_ends(t, IL, measured), stage_ends(t, IL, target)
    assert at_m.tolist() == simulate(t, measured).tolist()
    assert at_target.tolist() == simulate(t, target).tolist()


def test_more_chunks_shrink_the_fill_and_drain():
    p, m, zero = 4, 8, np.zeros(4, dtype=np.int64)
    # the same stage work (forward 200 + backward 400 ns per micro-batch) cut into 1, 2 or 4 chunks
    steps = [stage_ends(StageTimes(zero, zero, np.full(p, 200 // v), np.full(p, 400 // v), zero, zero, v),
                        IL if v > 1 else "1f1b", m)[0] for v in (1, 2, 4)]
    assert steps == [(m + p - 1) * 600, (2 * m + p - 1) * 300, (4 * m + p - 1) * 150]


def test_micro_batches_not_divisible_by_the_stages_are_refused():
    with pytest.raises(UsageError, match="divisible by the 4 stages"):
        interleaved_order(0, 4, 6, 2)


def test_the_scenario_counts_the_work_of_all_chunks():
    # MicroBatches scales MFU by M / m whatever the chunks; the pipeline carries v to the model
    part = MicroBatches(8, pipe=Pipeline(2, 4, IL, num_chunks=2))
    assert part.work_factor() == 2.0 and part.pipe.num_chunks == 2
