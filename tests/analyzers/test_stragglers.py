"""Stragglers on synthetic runs with planted faults: the right rank, host or link, the right cause,
and a cost close to the synthetic re-simulation without the fault; nobody flagged without one. A
rank measurably slower than its peers but cheaper than the flag threshold (the demo's planted 5 ms)
is still named, at info severity."""

import json
import shlex
from pathlib import Path

import numpy as np
import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers import stragglers
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.synth import Fault, Scenario, write_run
from bprof.synth.__main__ import main as synth_main

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
    slower = [r for (r,) in con.execute("SELECT rank FROM stragglers_ranks WHERE run_id = ? AND measurably_slower",
                                        [run_id]).fetchall()]
    if name == "none":
        assert findings == [] and flagged == [] and slower == []
        return
    if name in ("slow_rank", "stalled_input"):
        # its victims wait longer, but their own time is their peers': only the planted rank is slower
        assert slower == flagged and all(e["ranks"] == flagged for _, _, e in findings), findings
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


def test_a_rank_known_to_be_slower_costs_the_median_of_its_gains():
    # where a rank's delay lands on the critical path may change from step to step: once its own
    # time shows it slower in most steps, the price need not show that again
    assert stragglers._summarise([1578, 1648, 601]) == 0
    assert stragglers._summarise([1578, 1648, 601], recurs=True) == 1578
    assert stragglers._summarise([-5, -3, 2], recurs=True) == 0


def test_the_median_without_some_positions_is_the_median_of_the_rest():
    rng = np.random.default_rng(0)
    for _ in range(2000):
        n = int(rng.integers(1, 60))
        values = np.sort(rng.integers(0, 20, n))  # many ties
        excluded = np.sort(rng.choice(n, int(rng.integers(0, n)), replace=False))
        rest = np.delete(values, excluded)
        assert stragglers._median_without(values, excluded) == float(np.median(rest))


@pytest.mark.parametrize("own, peers, measurable, extra_ns", [
    # 5 ms more than peers whose own time changes by about 1 ms from step to step: every step
    ([105, 106, 105], [{0: 100, 1: 101}, {0: 101, 1: 100}, {0: 100, 1: 100}], True, 5),
    # the same 5 ms, but the peers' own time swings by about 10 ms from one step to the next
    ([105, 106, 105], [{0: 100, 1: 90}, {0: 110, 1: 100}, {0: 100, 1: 90}], False, 10),
    # far slower in one step of three only
    ([130, 100, 101], [{0: 100, 1: 101}, {0: 101, 1: 100}, {0: 100, 1: 100}], False, 0),
    # three steps of four are enough (a contended peer may hide one)
    ([105, 106, 100, 105], [{0: 100, 1: 101}, {0: 101, 1: 100}, {0: 101, 1: 100}, {0: 100, 1: 100}], True, 5),
    # one peer's own time never changes: any extra in every step is beyond its noise
    ([101, 101], [{0: 100}, {0: 100}], True, 1),
    ([100, 100], [{0: 100}, {0: 100}], False, 0),
])
def test_measurably_slower_is_extra_own_time_beyond_the_peers_step_to_step_spread(own, peers, measurable, extra_ns):
    ms = 1_000_000
    got = stragglers.measurably_slower([w * ms for w in own], [{r: w * ms for r, w in p.items()} for p in peers])
    assert got.measurable is measurable and got.extra_ns == pytest.approx(extra_ns * ms, abs=ms)


@pytest.mark.parametrize("own, peers", [
    ([105], [{0: 100, 1: 100}]),  # one step: no step-to-step spread to judge by
    ([105, 105], [{}, {}]),  # no peers
])
def test_measurably_slower_is_not_judged_without_the_data(own, peers):
    assert stragglers.measurably_slower(own, peers).measurable is None


DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.sh"


def _demo_commands() -> tuple[list[str], int]:
    """The synthetic run's generator arguments in examples/demo.sh (after its output directory) and
    how many findings its `bprof analyze` of that run prints."""
    lines = DEMO.read_text().splitlines()
    [synth] = [shlex.split(line) for line in lines if line.startswith("python -m bprof.synth ")]
    [analyze] = [shlex.split(line) for line in lines if line.startswith("bprof analyze synthetic")]
    top = int(analyze[analyze.index("--top") + 1]) if "--top" in analyze else 10  # the CLI's default
    return synth[4:], top


def _demo_run(tmp_path, args: list[str]):
    synth_main([str(tmp_path / "run"), *args])
    con = open_store(tmp_path / "s.duckdb")
    [r] = ingest_paths(con, [tmp_path / "run"], IngestOptions(name="demo"))
    analysis.analyze_run(con, r.run_id, Options())
    return con, r.run_id


def test_the_demos_planted_slow_rank_is_named_among_the_findings_it_prints(tmp_path):
    args, top = _demo_commands()
    slow = int(args[args.index("--slow-rank") + 1])
    con, run_id = _demo_run(tmp_path, args)
    shown = analysis.summary(con, run_id)["findings"][:top]
    [named] = [f for f in shown if f["analyzer"] == "stragglers"]
    assert named["evidence"]["ranks"] == [slow] and named["evidence"]["cause"] == "device", named
    # 5 ms of extra compute costs about 1.6 ms per step (its peers wait at its collectives): under
    # the flag threshold, so info; priced by the engine, within the rank's own step
    [(lost_ns, flagged, slower, extra_ns)] = con.execute(
        "SELECT lost_ns, flagged, measurably_slower, extra_own_ns FROM stragglers_ranks WHERE run_id = ? AND rank = ?",
        [run_id, slow]).fetchall()
    assert named["severity"] == "info" and not flagged and slower
    [step_ns] = con.execute("SELECT median(dur_ns) FROM steps WHERE run_id = ? AND rank = ?", [run_id, slow]).fetchone()
    assert named["lost_ns"] == lost_ns and 0 < lost_ns <= step_ns
    truth = json.loads((tmp_path / "run" / "truth.json").read_text())
    planted_ns = max(truth["faults"][0]["counterfactual"]["step_dur_delta_ns"])  # the job's step
    assert lost_ns == pytest.approx(planted_ns, rel=0.35), (lost_ns, planted_ns)  # measured: 1.01
    assert extra_ns == pytest.approx(truth["faults"][0]["extra_ns"], rel=0.2)


def test_the_demos_run_without_its_slow_rank_names_no_straggler(tmp_path):
    args, _ = _demo_commands()
    i = args.index("--slow-rank")
    con, run_id = _demo_run(tmp_path, args[:i] + args[i + 2:])
    assert _findings(con, run_id) == []
    assert con.execute("SELECT count(*) FROM stragglers_ranks WHERE run_id = ? AND measurably_slower",
                       [run_id]).fetchone()[0] == 0
