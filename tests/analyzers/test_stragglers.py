"""Stragglers on synthetic runs with planted faults: the right rank, host or link, the right cause,
and a cost close to the synthetic re-simulation without the fault; nobody flagged without one."""

import json

import numpy as np
import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers import stragglers
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.synth import Fault, Scenario, write_run

PLANTS = {  # name: (hosts, faults)
    "slow_rank": (2, [Fault("slow_rank", rank=3, extra_ns=20_000_000)]),
    "stalled_input": (2, [Fault("stalled_input", rank=1, extra_ns=20_000_000)]),
    "slow_host": (4, [Fault("slow_host", host=1, factor=1.3)]),
    "slow_link": (4, [Fault("slow_link", host=1, factor=4.0)]),
    "none": (2, []),
}


@pytest.fixture(scope="module", params=list(PLANTS))
def planted(request, tmp_path_factory):
    hosts, faults = PLANTS[request.param]
    out = tmp_path_factory.mktemp(request.param)
    truth = write_run(Scenario(tp=2, pp=2, dp=2, steps=3, hosts=hosts, seed=3, clock_jitter_ns=5_000,
                               clock_offset_ns={h: o for h, o in {0: 0, 1: 350_000, 2: -120_000, 3: 80_000}.items() if h < hosts},
                               faults=faults), out / "run")
    con = open_store(out / "s.duckdb")
    [r] = ingest_paths(con, [out / "run"], IngestOptions(name=request.param))
    analysis.analyze_run(con, r.run_id, Options())
    return request.param, con, r.run_id, truth


def _findings(con, run_id):
    return [(t, lost, json.loads(e)) for t, lost, e in con.execute(
        "SELECT title, lost_ns, evidence FROM findings WHERE run_id = ? AND analyzer = 'stragglers' ORDER BY lost_ns DESC",
        [run_id]).fetchall()]


def test_the_plant_is_found_with_its_cause_and_about_its_cost(planted):
    name, con, run_id, truth = planted
    findings = _findings(con, run_id)
    flagged = [r for (r,) in con.execute("SELECT rank FROM stragglers_ranks WHERE run_id = ? AND flagged", [run_id]).fetchall()]
    if name == "none":
        assert findings == [] and flagged == []
        return
    [fault] = truth["faults"]
    planted_ns = max(fault["counterfactual"]["step_dur_delta_ns"])  # the job's step: its longest rank
    title, lost_ns, evidence = findings[0]
    if name == "slow_rank":
        assert flagged == [3] and evidence["ranks"] == [3] and evidence["cause"] == "device"
    elif name == "stalled_input":
        assert flagged == [1] and evidence["ranks"] == [1] and evidence["cause"] == "host"
    elif name == "slow_host":
        assert title.startswith("Slow host: node1") and evidence["ranks"] == [2, 3] and evidence["cause"] == "device"
    elif name == "slow_link":
        assert title.startswith("Slow link") and evidence["host"] == "node1" and evidence["cause"] == "link"
    # measured: slow_rank 0.72, stalled_input 0.80, slow_host 0.95, slow_link 1.00 of the planted cost
    assert lost_ns == pytest.approx(planted_ns, rel=0.35), (lost_ns, planted_ns)


def test_host_clock_offsets_are_recovered_despite_the_plant(planted):
    _, con, run_id, truth = planted
    got = dict(con.execute("SELECT host, offset_ns FROM clock_hosts WHERE run_id = ?", [run_id]).fetchall())
    reference = truth["hosts"][0]["clock_offset_ns"]
    for h in truth["hosts"]:
        # written = true + offset: aligning subtracts the offset relative to the reference host
        assert abs(got[h["host"]] + (h["clock_offset_ns"] - reference)) <= 20_000, (h, got)


@pytest.mark.parametrize("gains, lost", [
    ([100, 90, 110, 105], 102),  # consistent: the median
    ([150, 60, 140, 130], 135),  # one step of four falls short (a contended peer): still a straggler
    ([40, 30, 0, 0], 0),  # two of four steps gain nothing: noise
    ([80, 0], 0),  # of two steps both must gain
    ([-5, -3, 2, 1], 0),  # its peers work more than it does: never negative
])
def test_a_cost_must_recur_in_most_steps(gains, lost):
    assert stragglers._summarise(gains) == lost


def test_the_median_without_some_positions_is_the_median_of_the_rest():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(1, 60))
        values = np.sort(rng.integers(0, 20, n))  # many ties
        excluded = np.sort(rng.choice(n, int(rng.integers(0, n)), replace=False))
        rest = np.delete(values, excluded)
        assert stragglers._median_without(values, excluded) == float(np.median(rest))
