"""Scenario strings and the alpha-beta collective model, exactly."""

import numpy as np
import pytest

from bprof.errors import UsageError
from bprof.whatif.scenarios import CollectiveModel, MicroBatches, NoHostGaps, NoStragglers, PerfectOverlap, Scale, collective_ns, parse


def test_parts_are_parsed_in_order():
    parts = parse("no-stragglers+scale:aten::mm=0.8+no-host-gaps+perfect-overlap+coll:bw=100,lat=5,algo=tree")
    assert [type(p) for p in parts] == [NoStragglers, Scale, NoHostGaps, PerfectOverlap, CollectiveModel]
    assert (parts[1].target, parts[1].factor) == ("aten::mm", 0.8)
    assert (parts[4].bw_gbps, parts[4].lat_us, parts[4].algo) == (100.0, 5.0, "tree")
    [mb] = parse("microbatches=8")
    assert isinstance(mb, MicroBatches) and mb.num_microbatches == 8 and mb.late


@pytest.mark.parametrize("text, message", [
    ("bogus", "unknown scenario 'bogus'"),
    ("scale:gemm", "expected scale:"),
    ("scale:gemm=0", "above 0"),
    ("scale:gemm=-1", "above 0"),
    ("scale:gemm=fast", "above 0"),
    ("no-stragglers+", "empty part"),
    ("coll:bw=100", "expected coll:"),
    ("coll:bw=0,lat=1", "bw must be above 0"),
    ("coll:bw=1,lat=1,algo=star", "ring or tree"),
    ("microbatches", "expected microbatches="),
    ("microbatches=0", "expected microbatches="),
    ("microbatches=2.5", "expected microbatches="),
    ("microbatches=many", "expected microbatches="),
])
def test_bad_scenarios_are_usage_errors(text, message):
    with pytest.raises(UsageError, match=message):
        parse(text)


def test_alpha_beta_ring_and_tree():
    op = np.array(["all_reduce", "all_gather", "broadcast", "p2p", "barrier", "all_reduce", "all_reduce"], dtype=object)
    size = np.array([8_000_000, 8_000_000, 8_000_000, 1_000_000, 0, -1, 1000])
    n = np.array([8, 8, 8, 2, 4, 8, 1])
    bw, lat = 100e9, 5e-6
    ring = collective_ns(op, size, n, bw, lat, "ring")
    assert ring.tolist() == [
        round((2 * 7 * lat + 2 * 7 / 8 * 8e6 / bw) * 1e9), round((7 * lat + 7 / 8 * 8e6 / bw) * 1e9),
        round((7 * lat + 8e6 / bw) * 1e9), round((lat + 1e6 / bw) * 1e9), round(2 * 3 * lat * 1e9), -1, 0]
    tree = collective_ns(op, size, n, bw, lat, "tree")
    assert tree[0] == round((2 * 3 * lat + 2 * 7 / 8 * 8e6 / bw) * 1e9)  # log2(8) = 3 hops each way
    assert tree[2] == round((3 * lat + 8e6 / bw) * 1e9)
    assert tree[1] == ring[1]  # all_gather has no tree: as ring
