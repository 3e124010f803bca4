"""The counterfactual engine on hand-built steps: it reproduces what was measured, and a faster rank
shortens the step by exactly what its delay cost through every group it shares."""

import numpy as np
import pytest

from bprof.analyzers.counterfactual import StepGraph, replay, work_segments
from bprof.whatif.engine import replay_in_order, replay_positions


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
    # rows sorted by (rank, replay position): (0,i10) (1,i10) (1,i11) (2,i11)
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


@pytest.mark.parametrize("first_rank", [0, 1 << 24])  # the radix sort, and the lexsort beyond any real job's ranks
def test_build_orders_each_chain_by_replay_position_even_with_ties(first_rank):
    """build's radix sort gives each rank's rows in replay order - by their instance's last arrival,
    then instance - as a lexsort would, whatever order the rows come in; groups them by instance in
    replay order; and its measured work and exits in replay order are work_segments' gathered there."""
    rng = np.random.default_rng(2)
    for n_inst in [1, 7, 200, 3000]:
        ranks = rng.integers(2, 9)
        rows = [(k, r) for k in range(n_inst) for r in rng.choice(ranks, rng.integers(1, ranks + 1), replace=False)]
        rows = [rows[i] for i in rng.permutation(len(rows))]
        dense = np.array([k for k, _ in rows])
        rank = np.array([first_rank + r for _, r in rows], dtype=np.int64)
        arrival = rng.integers(0, max(n_inst // 3, 1), len(rows))  # many instances share a last arrival
        end = arrival + rng.integers(0, 50, len(rows))
        g = StepGraph.build(dense, rank, arrival, end, first_rank + np.arange(ranks), np.zeros(ranks),
                            np.full(ranks, 10**6), instance_ids=np.arange(n_inst))
        last = np.zeros(n_inst, dtype=np.int64)
        np.maximum.at(last, dense, arrival)
        assert g.source_row.tolist() == np.lexsort((dense, last[dense], rank)).tolist()
        replayed = g.instance[g.rows_by_instance]
        assert np.array_equal(replayed, np.repeat(np.lexsort((np.arange(n_inst), last)), np.diff(g.instance_ptr)))
        some = rng.choice(len(rows), min(len(rows), 50), replace=False)
        assert np.array_equal(g.rows_by_instance[replay_positions(g, some)], some)
        work, tail = work_segments(g)
        assert np.array_equal(g.work_in_order, work[g.rows_by_instance]) and np.array_equal(g.tail_ns, tail)
        assert np.array_equal(g.exit_in_order, (g.end_ns - g.last_arrival_ns[g.instance])[g.rows_by_instance])
        assert replay(g).end_ns.tolist() == [10**6] * ranks  # exact, ties and all
        assert replay(g, work, tail).end_ns.tolist() == [10**6] * ranks


def test_two_instances_ending_their_arrivals_at_once_replay_exactly():
    """Rank 0 arrives at B (5) before A (8); both instances' last arrival is rank 1's at 10. A chain
    ordered by own arrival (B, A) against a replay ordered A, B counted A's work from B's exit and
    replayed B's exit 7 ns late; the chain in replay order is exact."""
    g = StepGraph.build(instance=[0, 0, 1, 1], rank=[0, 1, 0, 1], arrival_ns=[8, 10, 5, 10], end_ns=[12, 12, 13, 13],
                        span_rank=[0, 1], span_start_ns=[0, 0], span_end_ns=[20, 20])
    assert replay(g).end_ns.tolist() == [20, 20]
    work, tail = work_segments(g)
    # rank 0's B (5) comes before every event of its chain: from A's exit, as before; rank 1 arrives
    # at B as it arrives at A (10): anchored to that arrival, not to A's exit two ns later
    assert work.tolist() == [8, 5 - 12, 10, 0] and replay(g, work, tail).end_ns.tolist() == [20, 20]


def test_gains_in_one_walk_are_each_sets_own_replay_and_leave_the_step_as_it_was():
    from bprof.whatif.peers import PeerStep

    rng = np.random.default_rng(3)
    ranks, n_inst = 8, 400
    # every instance joins all 8 ranks, so every rank has the same role signature
    dense = np.repeat(np.arange(n_inst), ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int32), n_inst)
    arrival = dense * 1000 + rng.integers(0, 300, len(dense)) + (rank == 5) * 200  # rank 5 arrives late
    g = StepGraph.build(dense, rank, arrival, dense * 1000 + 600, np.arange(ranks), np.zeros(ranks),
                        np.full(ranks, n_inst * 1000 + 100), instance_ids=np.arange(n_inst))
    step = PeerStep(g, np.zeros(len(dense), dtype=np.int64), np.zeros(ranks, dtype=np.int64), set(range(ranks)))
    before = step.work_in_order.copy()
    sets = [{5}, {0}, {1, 5}, {2}, {3, 4}]
    expected = []
    for s in sets:  # each set replayed on its own, the plain way
        work_in_order, tail, exit_in_order = step.like_peers(s)
        assert np.array_equal(exit_in_order, step.exit_in_order)  # no symmetric flags given: exits stay
        expected.append(step.step_ns - replay_in_order(g, work_in_order, step.exit_in_order, tail).step_ns)
    assert step.gains(sets) == expected == [step.gain(s) for s in sets]
    assert step.gains(sets, threads=3) == expected
    assert expected[0] > 0 and np.array_equal(step.work_in_order, before)


def test_a_rank_working_like_its_peers_leaves_a_symmetric_collective_with_its_first_member():
    """Rank 5 arrives late and also leaves every all-reduce 150 ns after the others (its host slow to
    resume). Working like its peers, it leaves with the first member: the gain is the plain replay
    with those exits, larger than with its own exits, and the same in one walk of many sets."""
    from bprof.whatif.peers import PeerStep

    rng = np.random.default_rng(4)
    ranks, n_inst = 8, 300
    dense = np.repeat(np.arange(n_inst), ranks)
    rank = np.tile(np.arange(ranks, dtype=np.int32), n_inst)
    arrival = dense * 1000 + rng.integers(0, 300, len(dense)) + (rank == 5) * 200
    end = dense * 1000 + 600 + (rank == 5) * 150
    g = StepGraph.build(dense, rank, arrival, end, np.arange(ranks), np.zeros(ranks),
                        np.full(ranks, n_inst * 1000 + 300), instance_ids=np.arange(n_inst))
    role, stage = np.zeros(len(dense), dtype=np.int64), np.zeros(ranks, dtype=np.int64)
    plain = PeerStep(g, role, stage, set(range(ranks)))
    step = PeerStep(g, role, stage, set(range(ranks)), symmetric=np.ones(n_inst, dtype=bool))
    work_in_order, tail, exit_in_order = step.like_peers({5})
    moved = exit_in_order != step.exit_in_order
    # exactly rank 5's rows, each moved to its instance's first exit, 150 ns earlier
    assert np.array_equal(np.flatnonzero(moved), np.flatnonzero(g.rank[g.rows_by_instance] == 5))
    assert np.array_equal(step.exit_in_order[moved] - exit_in_order[moved], np.full(n_inst, 150))
    expected = step.step_ns - replay_in_order(g, work_in_order, exit_in_order, tail).step_ns
    sets = [{5}, {0}, {1, 5}]
    gains = step.gains(sets)
    assert gains[0] == expected == step.gain({5}) and gains == step.gains(sets, threads=3)
    assert gains[0] > plain.gain({5}) and gains[1] == plain.gain({0})
