"""The step graph of collectives issued and waited apart (DDP buckets, FSDP prefetch, async_op):
hand-built steps whose right answer is worked out by hand in each test."""

import numpy as np

from bprof.whatif.engine import StepGraph, replay, work_segments


def _ddp(host_waited=None):
    # rank 0 issues buckets A (t=1) and B (t=2) during backward and waits at the end; rank 1, slow,
    # issues A at 10 and B at 11. Each transfer takes 2 after the last arrival; the optimizer runs 1
    # after the last exit. Rank 0's host was idle while both ended (it waited in finalize).
    return StepGraph.build(instance=[0, 0, 1, 1], rank=[0, 1, 0, 1], arrival_ns=[1, 10, 2, 11], end_ns=[12, 12, 13, 13],
                           span_rank=[0, 1], span_start_ns=[0, 0], span_end_ns=[14, 14], issue_ns=[1, 10, 2, 11],
                           host_waited=host_waited)


def test_a_bucket_issued_while_another_waits_keeps_its_host_work():
    g = _ddp()
    work, tail = work_segments(g)
    # rows by (rank, replay position): (0,A) (0,B) (1,A) (1,B); B is issued 1 after A on both ranks,
    # never "10 before A's exit" as a chain from the previous exit had it
    assert work.tolist() == [1, 1, 10, 1] and tail.tolist() == [1, 1]
    assert replay(g).end_ns.tolist() == [14, 14]


def test_the_slow_rank_working_like_its_peer_buys_its_extra_work_once():
    g = _ddp()
    work, tail = work_segments(g)
    faster = work.copy()
    faster[(g.rank == 1) & (g.instance == 0)] = 1  # rank 1 issues A at 1, like rank 0
    r = replay(g, faster)
    # A: last arrival 1, exits 3; B: issued 1 later on both, arrives 2, exits 4; optimizer: 5
    assert r.end_ns.tolist() == [5, 5] and r.step_ns == 5  # 9 shorter: the 9 rank 1 had extra


def test_an_issue_after_a_wait_is_released_by_the_exit_it_waited_for():
    # synchronous: rank 0 issues A at 1 and blocks (idle) until A ends at 12, computes 3, issues B at 15
    g = StepGraph.build(instance=[0, 0, 1, 1], rank=[0, 1, 0, 1], arrival_ns=[1, 10, 15, 15], end_ns=[12, 12, 17, 17],
                        span_rank=[0, 1], span_start_ns=[0, 0], span_end_ns=[18, 18], issue_ns=[1, 10, 15, 15],
                        host_waited=[True, True, True, True])
    work, _ = work_segments(g)
    assert work.tolist() == [1, 3, 10, 3]
    faster = work.copy()
    faster[(g.rank == 1) & (g.instance == 0)] = 1
    assert replay(g, faster).step_ns == 18 - 9


def test_an_exit_the_host_did_not_wait_for_releases_nothing():
    # the same times, but rank 0's host was busy when A ended (it computed from 1 to 15): B's issue
    # follows A's issue by 14 of host work, and a faster peer cannot move it earlier
    g = StepGraph.build(instance=[0, 0, 1, 1], rank=[0, 1, 0, 1], arrival_ns=[1, 10, 15, 15], end_ns=[12, 12, 17, 17],
                        span_rank=[0, 1], span_start_ns=[0, 0], span_end_ns=[18, 18], issue_ns=[1, 10, 15, 15],
                        host_waited=[False, True, True, True])
    work, _ = work_segments(g)
    assert work.tolist() == [1, 14, 10, 3]
    faster = work.copy()
    faster[(g.rank == 1) & (g.instance == 0)] = 1
    r = replay(g, faster)
    assert r.end_ns.tolist() == [18, 18]  # rank 0's own 15 of host work before B bounds the step


def test_a_call_queued_behind_an_exit_starts_after_it_and_never_before_its_issue():
    # rank 0's worker runs one collective at a time: B, issued at 2, starts when A ends at 12
    g = StepGraph.build(instance=[0, 0, 1, 1], rank=[0, 1, 0, 1], arrival_ns=[1, 10, 12, 12], end_ns=[12, 12, 14, 14],
                        span_rank=[0, 1], span_start_ns=[0, 0], span_end_ns=[15, 15], issue_ns=[1, 10, 2, 11])
    assert replay(g).end_ns.tolist() == [15, 15]
    work, _ = work_segments(g)
    faster = work.copy()
    faster[(g.rank == 1) & (g.instance == 0)] = 1  # rank 1 issues A at 1: A exits at 3
    r = replay(g, faster)
    # rank 0's B starts at A's new exit 3; rank 1 issues B 1 after A (2) and, queued too, starts at 3;
    # B exits 2 later (5), the span 1 after (6)
    assert r.end_ns.tolist() == [6, 6]
    slower = work.copy()
    slower[(g.rank == 0) & (g.instance == 1)] = 20  # rank 0's host issues B at 21, long after A's exit
    assert replay(g, slower).end_ns.tolist() == [24, 24]  # B arrives at its issue, not at A's exit


def test_without_issue_times_the_graph_is_the_arrival_chain():
    g = StepGraph.build(instance=[0, 0, 1, 1], rank=[0, 1, 0, 1], arrival_ns=[1, 10, 2, 11], end_ns=[12, 12, 13, 13],
                        span_rank=[0, 1], span_start_ns=[0, 0], span_end_ns=[14, 14])
    assert np.array_equal(g.issue_ns, g.arrival_ns) and replay(g).end_ns.tolist() == [14, 14]
