"""coalesce-small: a storm of small collectives of one group and op sent as one, on hand-built steps
whose right answer is worked out by hand."""

import numpy as np
import pytest

from bprof.errors import UsageError
from bprof.whatif.engine import StepGraph, exit_offsets, replay, work_segments
from bprof.whatif.graph import StepModel
from bprof.whatif.scenarios import State, parse

GROUP = 5 << 36  # match.sql packs the group into instance_id >> 36


def _storm(sizes, ops=None, groups=None):
    """2 ranks, synchronous calls one after the other: each arrives 1 after the previous exit on both
    ranks and takes 2 after the last arrival; the span ends 1 after the last exit."""
    n = len(sizes)
    ops = ops or ["all_reduce"] * n
    groups = groups or [GROUP] * n
    arrival, end, t = [], [], 0
    for _ in range(n):
        arrival.append(t + 1)
        end.append(t + 3)
        t += 3
    g = StepGraph.build(instance=np.repeat(np.arange(n), 2), rank=[0, 1] * n, arrival_ns=np.repeat(arrival, 2),
                        end_ns=np.repeat(end, 2), span_rank=[0, 1], span_start_ns=[0, 0], span_end_ns=[t + 1, t + 1],
                        instance_ids=np.array([grp + i for i, grp in enumerate(groups)], dtype=np.int64),
                        issue_ns=np.repeat(arrival, 2), host_waited=[True] * 2 * n)
    work, tail = work_segments(g)
    zeros = np.zeros(2 * n, dtype=np.int64)
    return StepModel(step=0, g=g, role=np.zeros(2, dtype=np.int64), stage=np.full(2, -1), offset_ns=np.zeros(2, dtype=np.int64),
                     work=work, tail=tail, exit_after=exit_offsets(g), host_ns=zeros, tail_host_ns=np.zeros(2, dtype=np.int64),
                     op=np.array(ops, dtype=object), bytes=np.array(sizes, dtype=np.int64), group_size=np.full(n, 2),
                     dim=np.array(["dp"] * n, dtype=object), has_events=np.ones(2, dtype=bool))


def _predicted(m: StepModel, scenario: str) -> int:
    s = State.measured(m)
    for p in parse(scenario):
        p.apply(None, 1, m, s)
    return replay(m.g, s.work, s.tail, s.exit_after).step_ns


def test_small_calls_of_one_group_pay_one_transfer():
    m = _storm([4] * 4)
    assert replay(m.g).step_ns == 13  # 4 x (1 + 2) + 1
    # one call: issued at 1, its transfer 2, the tail 1; the other three calls' transfers (2 each)
    # and the host's call overhead before each next call (1 each) go
    assert _predicted(m, "coalesce-small") == 13 - 3 * (2 + 1)


def test_large_calls_other_ops_and_other_groups_are_batched_apart():
    # a 1 MiB all-reduce keeps its transfer; the all-gather and the call on another group are batches of one
    m = _storm([4, 4, 1 << 20, 4, 4], ops=["all_reduce", "all_reduce", "all_reduce", "all_gather", "all_reduce"],
               groups=[GROUP, GROUP, GROUP, GROUP, 6 << 36])
    assert replay(m.g).step_ns == 16
    # only the first of the two small all-reduces of group 5 is folded: its transfer and the 1 before the next go
    assert _predicted(m, "coalesce-small") == 16 - 3
    assert _predicted(m, "coalesce-small:2") == 16  # nothing is 2 bytes or less


def test_a_size_that_is_not_a_count_is_a_usage_error():
    with pytest.raises(UsageError, match="coalesce-small"):
        parse("coalesce-small:big")


def test_work_on_one_rank_between_two_calls_splits_the_batch():
    # the host works 4 between calls 1 and 2 on rank 1 only: calls 0 and 1 are still one batch
    m = _storm([4] * 3)
    s = State.measured(m)
    s.work = np.where((m.g.rank == 1) & (m.g.instance == 2), 4, s.work)
    before = replay(m.g, s.work, s.tail, s.exit_after).step_ns
    [part] = parse("coalesce-small")
    part.apply(None, 1, m, s)
    assert part.freed(m, s.work, m.exit_after).tolist() == [True, False, False]
    assert replay(m.g, s.work, s.tail, s.exit_after).step_ns == before - 3


def test_small_calls_with_work_between_them_are_no_batch():
    # tensor-parallel style: 4 of host work between the small all-reduces (each transfer 2): the
    # next call depends on the work, so nothing is batched
    m = _storm([4] * 3)
    work = m.work.copy()
    work[m.g.instance > 0] = 4  # the rows of instances 1 and 2 on both ranks
    s = State.measured(m)
    s.work = work
    before = replay(m.g, s.work, s.tail, s.exit_after).step_ns
    assert before == 4 * 2 + 1 + 2 * 3 + 1  # issue at 1, then 4 of work before each later call
    [part] = parse("coalesce-small")
    part.apply(None, 1, m, s)
    assert replay(m.g, s.work, s.tail, s.exit_after).step_ns == before


def test_python_between_the_calls_is_no_work_that_splits_a_batch():
    # 4 between the calls (each transfer 2), all of it a host gap (the interpreter between two
    # calls, no op): a storm still, batched whole; with 1 of it an op it still is; with 3, not
    m = _storm([4] * 3)
    work = m.work.copy()
    work[m.g.instance > 0] = 4
    m.work = work
    before = replay(m.g, m.work, m.tail, m.exit_after).step_ns
    [part] = parse("coalesce-small")
    for ops_ns, folded in [(0, [True, True, False]), (1, [True, True, False]), (3, [False, False, False])]:
        m.host_ns = np.where(m.g.instance > 0, 4 - ops_ns, 0)
        assert part.freed(m, m.work, m.exit_after).tolist() == folded, ops_ns
    m.host_ns = np.where(m.g.instance > 0, 4, 0)
    # one call left: 1 before it, its transfer 2, the tail 1
    assert _predicted(m, "coalesce-small") == 4 < before
