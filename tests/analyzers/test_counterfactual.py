"""The counterfactual engine on hand-built steps: it reproduces what was measured, and a faster rank
shortens the step by exactly what its delay cost through every group it shares."""

import numpy as np
import pytest

from bprof.analyzers.counterfactual import StepGraph, replay, work_segments


def _two_groups():
    # ranks 0,1 share instance 10 (rank 1 late), then ranks 1,2 share instance 11; rank 2 waits for 1
    return StepGraph.build(instance=[10, 10, 11, 11], rank=[0, 1, 1, 2], arrival_ns=[10, 30, 40, 20],
                           end_ns=[35, 35, 48, 48], span_rank=[0, 1, 2], span_start_ns=[0, 0, 0],
                           span_end_ns=[45, 50, 60])


def test_unchanged_work_reproduces_every_measured_end():
    g = _two_groups()
    r = replay(g)
    assert r.end_ns.tolist() == [45, 50, 60] and r.step_ns == 60


def test_work_segments_are_the_time_between_exits_and_arrivals():
    work, tail = work_segments(_two_groups())
    # rows sorted by (rank, arrival): (0,i10) (1,i10) (1,i11) (2,i11)
    assert work.tolist() == [10, 30, 5, 20] and tail.tolist() == [10, 2, 12]


def test_a_faster_straggler_shortens_the_step_through_the_groups_it_shares():
    g = _two_groups()
    work, tail = work_segments(g)
    faster = work.copy()
    faster[(g.rank == 1) & (g.arrival_ns == 30)] = 10  # rank 1 arrives with rank 0 at instance 10
    r = replay(g, faster)
    # i10: both arrive at 10, leave 5 after -> 15; rank 1 arrives at i11 at 20 with rank 2 -> leaves 28
    assert r.end_ns.tolist() == [25, 30, 40]
    assert r.step_ns == 40  # 20 ns shorter: the whole delay, passed on to rank 2 through i11


def test_empty_step_is_its_spans():
    g = StepGraph.build(instance=np.array([], dtype=np.int64), rank=[], arrival_ns=[], end_ns=[], span_rank=[0, 1],
                        span_start_ns=[0, 5], span_end_ns=[10, 20])
    assert replay(g).step_ns == 20


def test_straggler_cost_agrees_with_the_synthetic_resimulation_without_it(tmp_path):
    """bprof.synth re-simulates the run without the planted slow rank (truth counterfactual); the engine,
    given only the planted run's collectives and spans, must find about the same step-time gain."""
    import statistics

    from bprof.synth import Fault, Scenario, write_run

    truth = write_run(Scenario(tp=2, pp=2, dp=2, steps=3, hosts=2, seed=3,
                               faults=[Fault("slow_rank", rank=3, extra_ns=5_000_000)]), tmp_path / "run", gzip=False)
    slow, ranks = 3, truth["ranks"]
    lost = []
    for s in range(len(ranks[0]["steps"])):
        rows = [(i, m["rank"], m["arrival_ns"], m["end_ns"]) for i, c in enumerate(truth["collectives"]) if c["step"] == s
                for m in c["members"]]
        inst, rank, arrival, end = map(list, zip(*rows))
        starts = [r["step_ts_ns"][s] for r in ranks]
        ends = [r["step_ts_ns"][s + 1] if s + 1 < len(r["steps"]) else r["step_ts_ns"][s] + r["step_dur_ns"][s] for r in ranks]
        g = StepGraph.build(inst, rank, arrival, end, [r["rank"] for r in ranks], starts, ends)
        base = replay(g)
        assert base.end_ns.tolist() == ends  # exact on unchanged work
        work, _ = work_segments(g)
        like_peers = work.copy()
        for members in map(g.members, range(len(g.instance_ids))):
            mine = [i for i in members.tolist() if g.rank[i] == slow]
            peers = [work[i] for i in members.tolist() if g.rank[i] != slow]
            if mine and peers:
                like_peers[mine[0]] = int(statistics.median(peers))
        lost.append(base.step_ns - replay(g, like_peers).step_ns)
    planted = max(truth["faults"][0]["counterfactual"]["step_dur_delta_ns"])  # the job's step: its longest rank
    assert statistics.mean(lost) == pytest.approx(planted, rel=0.25), (lost, planted)


def test_chain_order_is_the_four_key_sort_even_with_ties():
    from bprof.analyzers.counterfactual import _chain_order

    rng = np.random.default_rng(1)
    for _ in range(100):
        n = int(rng.integers(1, 300))
        rank, last = rng.integers(0, 5, n), rng.integers(0, 20, n) + 10**12  # many ties on (rank, last)
        arrival, dense = last - rng.integers(0, 5, n), rng.integers(0, 50, n)
        assert np.array_equal(_chain_order(rank, last, arrival, dense), np.lexsort((dense, arrival, last, rank)))


def test_chain_order_is_rank_then_last_arrival_then_own_arrival_then_instance():
    """The compiled counting sort per rank gives exactly the order of a 4-key lexsort, ties included,
    whatever order the rows come in."""
    from bprof.analyzers.counterfactual import _chain_order

    rng = np.random.default_rng(1)
    for n in [0, 1, 5, 1000, 100_000]:
        rank, dense = rng.integers(0, 50, n), rng.permutation(n)
        last, arrival = rng.integers(0, 30, n), rng.integers(0, 1000, n)  # many ties on (rank, last)
        assert _chain_order(rank, last, arrival, dense).tolist() == np.lexsort((dense, arrival, last, rank)).tolist()
