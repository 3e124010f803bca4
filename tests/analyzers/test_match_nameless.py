"""Collectives that name no process group (issue 21, item 4: the V100 8-rank DLRM job traced with
NCCL): matched in a group inferred from the ranks' call sequences, so that the late rank is named
as the straggler and priced by the what-if engine, and its peers' waiting is not advised away as
communication to overlap. Where the ranks' sequences disagree nothing is merged.

The truth comes from the trace files themselves, read here with the stdlib (not bprof's reader):
how late the late rank reaches each step's first collective, and what the transfers take."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.whatif.run import saved_ns
from tests.analyzers.nameless_dlrm import WORLD, write_run

LATE = 7


def _ingest(tmp_path_factory, name: str, **kwargs):
    out = tmp_path_factory.mktemp(name)
    write_run(out / "run", late_rank=LATE, **kwargs)
    con = open_store(out / "s.duckdb")
    [r] = ingest_paths(con, [out / "run"], IngestOptions(name=name))
    analysis.analyze_run(con, r.run_id, Options())
    return con, r.run_id, out / "run"


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    return _ingest(tmp_path_factory, "dlrm")


@pytest.fixture(scope="module")
def desync(tmp_path_factory):
    return _ingest(tmp_path_factory, "desync", disagree=(3, 4))


def _truth(run: Path) -> dict:
    """From the raw JSON: per step, each rank's collective kernels (start, end) in order; the late
    rank's delay at the first collective (its start minus the latest other rank's); the transfer of
    each collective (the common end minus the last start)."""
    kernels: dict[int, dict[int, list[tuple[float, float]]]] = {}
    for path in sorted(run.glob("rank*.json.gz")):
        trace = json.load(gzip.open(path, "rt"))
        rank = trace["distributedInfo"]["rank"]
        events = trace["traceEvents"]
        steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in events
                 if e.get("ph") == "X" and e["name"].startswith("ProfilerStep#")]
        for step, lo, hi in steps:
            kernels.setdefault(step, {})[rank] = sorted(
                (e["ts"], e["ts"] + e["dur"]) for e in events
                if e.get("cat") == "kernel" and e["name"].startswith("nccl") and lo <= e["ts"] < hi)
    delays, transfers, calls = [], [], 0
    for step, by_rank in kernels.items():
        others = [k[0][0] for r, k in by_rank.items() if r != LATE]
        delays.append((by_rank[LATE][0][0] - max(others)) * 1000)
        n = len(by_rank[0])
        calls += n
        transfers.append(sum(statistics.median(by_rank[r][i][1] for r in by_rank)
                             - max(by_rank[r][i][0] for r in by_rank) for i in range(n)) * 1000)
    return {"delay_ns": statistics.median(delays), "transfer_ns": statistics.median(transfers),
            "num_instances": calls, "steps": sorted(kernels)}


def test_every_call_is_matched_with_all_eight_members_in_an_inferred_group(dlrm):
    con, run_id, run = dlrm
    truth = _truth(run)
    rows = con.execute("""SELECT status, group_from, num_members, num_expected, count(*) FROM match_instances
                          WHERE run_id = ? GROUP BY ALL""", [run_id]).fetchall()
    assert rows == [("complete", "sequence", WORLD, WORLD, truth["num_instances"])]
    steps = con.execute("SELECT step, ranks, inferred, reason FROM match_nameless_steps WHERE run_id = ? ORDER BY step",
                        [run_id]).fetchall()
    assert steps == [(s, list(range(WORLD)), True, None) for s in truth["steps"]]
    [title] = [t for (t,) in con.execute("SELECT title FROM findings WHERE run_id = ? AND analyzer = 'match'",
                                          [run_id]).fetchall()]
    assert "inferred from their call sequences" in title and str(list(range(WORLD))) in title


def test_the_late_rank_is_the_straggler_priced_by_the_engine_at_its_delay(dlrm):
    con, run_id, run = dlrm
    truth = _truth(run)
    findings = con.execute("""SELECT lost_ns, evidence FROM findings WHERE run_id = ? AND analyzer = 'stragglers'
                              ORDER BY lost_ns DESC""", [run_id]).fetchall()
    assert findings, "no straggler named"
    lost_ns, evidence = findings[0]
    assert json.loads(evidence)["ranks"] == [LATE]
    assert lost_ns == pytest.approx(truth["delay_ns"], rel=0.05)
    flagged = [r for (r,) in con.execute("SELECT rank FROM stragglers_ranks WHERE run_id = ? AND flagged", [run_id]).fetchall()]
    assert flagged == [LATE]
    # the same engine as every what-if: the no-stragglers scenario replays it to the same gain, within
    # the trace's microsecond: the straggler finding measures the job's step from the earliest start
    # to the latest end, the what-if as its longest rank (two definitions, an open item of issue 20;
    # they parted by 1,000 ns here once steps were measured on the device)
    found, why = saved_ns(con, run_id, ["no-stragglers"])
    assert found.keys() == {"no-stragglers"}, why
    assert abs(found["no-stragglers"] - lost_ns) <= 1_000


def test_no_finding_advises_overlapping_the_wait_the_straggler_causes(dlrm):
    con, run_id, run = dlrm
    truth = _truth(run)
    overlap = con.execute("""SELECT title, lost_ns FROM findings WHERE run_id = ? AND analyzer = 'breakdown'
                             AND title LIKE 'Exposed %communication%'""", [run_id]).fetchall()
    assert overlap, "the exposed transfers are a finding of their own"
    for title, lost_ns in overlap:
        # at most the transfers the trace shows, far from the late rank's delay
        assert lost_ns <= truth["transfer_ns"] * 1.02, title
        assert lost_ns < truth["delay_ns"] / 2, title


def test_ranks_whose_sequences_disagree_stay_unmatched_with_the_reason(desync):
    con, run_id, _ = desync
    assert con.execute("SELECT count(*) FROM match_instances WHERE run_id = ?", [run_id]).fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM match_members WHERE run_id = ?", [run_id]).fetchone()[0] == 0
    steps = con.execute("SELECT inferred, reason FROM match_nameless_steps WHERE run_id = ?", [run_id]).fetchall()
    assert steps and not any(inferred for inferred, _ in steps)
    for _, reason in steps:
        assert "disagree" in reason and "on ranks [3, 4]" in reason and "on ranks [0, 1, 2, 5, 6, 7]" in reason
    [(severity, title)] = con.execute("""SELECT severity, title FROM findings WHERE run_id = ? AND analyzer = 'match'""",
                                      [run_id]).fetchall()
    assert severity == "not_measurable" and "cannot be inferred" in title
    # nothing matched, nobody priced as a straggler from merged calls
    assert con.execute("SELECT count(*) FROM findings WHERE run_id = ? AND analyzer = 'stragglers'",
                       [run_id]).fetchone()[0] == 0


def test_a_traced_group_size_below_the_ranks_calling_is_not_taken_for_the_world(tmp_path_factory):
    con, run_id, _ = _ingest(tmp_path_factory, "subgroups", group_size=2)
    assert con.execute("SELECT count(*) FROM match_instances WHERE run_id = ?", [run_id]).fetchone()[0] == 0
    reasons = {r for (r,) in con.execute("SELECT reason FROM match_nameless_steps WHERE run_id = ?", [run_id]).fetchall()}
    assert reasons == {"the traced group size 2 is not the 8 ranks making them: they belong to smaller groups that "
                       "cannot be told apart"}
