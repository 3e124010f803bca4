"""Clock alignment: exact offsets from hand-built clock samples and collective exits, planted
per-host offsets recovered from synthetic runs despite jitter and a straggler, and a real two-host
`bprof record` run whose second host's clock is 5 s ahead."""

import json

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from tests.analyzers.tables import tiny_store
from tests.analyzers.test_match import CROSSRANK, add_calls, crossrank, rows
from tests.profiler.test_record import TRAINER, record_two_hosts

AHEAD_NS = 1_000_000  # host b's clock reads this much more than host a's


def _two_hosts(tmp_path):
    """Ranks 0, 1 on host a; 2, 3 on host b, whose clock is AHEAD_NS ahead."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=4,
                             steps=[(r, 1, (AHEAD_NS if r >= 2 else 0), 100_000) for r in range(4)])
    con.execute("UPDATE ranks SET host = CASE WHEN rank < 2 THEN 'a' ELSE 'b' END WHERE run_id = ?", [run_id])
    return con, run_id


def _add_samples(con, run_id):
    # true (send, reference answers, receive); b writes true + AHEAD_NS, the reference (rank 0) true time
    true = [("start:1:2", 100, 150, 200), ("start:1:2", 300, 340, 410), ("start:1:2", 500, 700, 800),
            ("end:1:2", 5000, 5030, 5060)]
    for phase, send, ref, recv in true:
        con.execute("INSERT INTO clock_samples VALUES (?, 2, 0, ?, ?, ?, ?)",
                    [run_id, phase, send + AHEAD_NS, ref, recv + AHEAD_NS])
    # best per phase: rtt 100 (offset exactly -AHEAD_NS) and rtt 60 (the same), so the residual is half of 100,
    # or less: 30, the distance to the ends of the bounds every sample allows, [-1_000_030, -999_970]


def _add_all_reduces(con, run_id, b_end_lag_ns):
    """One all_reduce per lag over ranks 0 and 2, ending together in true time; rank 2 arrives late
    (a straggler: arrivals are not symmetric, exits are). b's end on its own clock = a's + AHEAD_NS + lag."""
    calls = []
    for i, lag in enumerate(b_end_lag_ns):
        t = 10_000 * (i + 1)
        calls += [{"rank": 0, "op": "all_reduce", "pg_ranks": [0, 2], "seq": i, "step": 1, "arrival": t, "end": t + 5000},
                  {"rank": 2, "op": "all_reduce", "pg_ranks": [0, 2], "seq": i, "step": 1,
                   "arrival": t + 4000 + AHEAD_NS, "end": t + 5000 + AHEAD_NS + lag}]
    add_calls(con, run_id, calls)


def _hosts(con, run_id):
    return [tuple(r.values()) for r in rows(con, """
        SELECT host, ranks, offset_ns, residual_ns, method, via_host, num_samples, num_collectives
        FROM clock_hosts WHERE run_id = ? ORDER BY host""", run_id)]


def _findings(con, run_id):
    return [(r["severity"], r["title"], json.loads(r["evidence"])) for r in rows(
        con, "SELECT * FROM findings WHERE run_id = ? AND analyzer = 'clock' ORDER BY finding_id", run_id)]


def test_samples_give_the_offset_of_the_best_round_trips_and_align_members(tmp_path, monkeypatch):
    con, run_id = _two_hosts(tmp_path)
    _add_samples(con, run_id)
    _add_all_reduces(con, run_id, [0])  # one instance: too few exits to count
    crossrank(con, run_id, monkeypatch, ["match", "clock"])
    assert _hosts(con, run_id) == [("a", [0, 1], 0, 0, "reference", None, 0, 1),
                                   ("b", [2, 3], -AHEAD_NS, 30, "samples", "a", 4, 1)]
    assert con.execute("SELECT list(clock_offset_ns ORDER BY rank), list(clock_residual_ns ORDER BY rank) FROM ranks").fetchone() \
        == ([0, 0, -AHEAD_NS, -AHEAD_NS], [0, 0, 30, 30])
    assert con.execute("SELECT list((rank, arrival_aligned_ns, end_aligned_ns) ORDER BY rank) FROM match_members_aligned").fetchone()[0] \
        == [(0, 10_000, 15_000), (2, 14_000, 15_000)]
    assert _findings(con, run_id) == []


def test_exits_refine_the_samples_within_their_bounds(tmp_path, monkeypatch):
    con, run_id = _two_hosts(tmp_path)
    _add_samples(con, run_id)
    _add_all_reduces(con, run_id, [20, 24, 16])  # median lag 20, MAD 4 -> residual 1.4826 * 4
    crossrank(con, run_id, monkeypatch, ["match", "clock"])
    assert _hosts(con, run_id)[1] == ("b", [2, 3], -AHEAD_NS - 20, 6, "samples+exits", "a", 4, 3)


def test_exits_outside_the_samples_bounds_lose_to_the_samples(tmp_path, monkeypatch):
    con, run_id = _two_hosts(tmp_path)
    _add_samples(con, run_id)
    _add_all_reduces(con, run_id, [100, 100, 100])  # would put b at -1_000_100, outside [-1_000_030, -999_970]
    crossrank(con, run_id, monkeypatch, ["match", "clock"])
    assert _hosts(con, run_id)[1] == ("b", [2, 3], -AHEAD_NS, 30, "samples", "a", 4, 3)
    [(severity, title, evidence)] = _findings(con, run_id)
    assert severity == "info" and "disagree" in title
    assert (evidence["hosts"], evidence["exits_offset_ns"], evidence["samples_offset_ns"]) == (["b"], [-AHEAD_NS - 100], [-AHEAD_NS])


def test_without_samples_the_exits_alone_align_and_too_few_exits_do_not(tmp_path, monkeypatch):
    con, run_id = _two_hosts(tmp_path)
    _add_all_reduces(con, run_id, [7, 3, 5])
    crossrank(con, run_id, monkeypatch, CROSSRANK)
    assert _hosts(con, run_id)[1] == ("b", [2, 3], -AHEAD_NS - 5, 3, "exits", "a", 0, 3)

    con2, run2 = _two_hosts(tmp_path / "few")
    _add_all_reduces(con2, run2, [7, 3])
    crossrank(con2, run2, monkeypatch, CROSSRANK)
    assert _hosts(con2, run2)[1] == ("b", [2, 3], None, None, "none", None, 0, 2)
    assert con2.execute("SELECT list(clock_offset_ns ORDER BY rank) FROM ranks").fetchone()[0] == [0, 0, None, None]
    [(severity, title, evidence)] = _findings(con2, run2)
    assert severity == "not_measurable" and evidence["hosts"] == ["b"]
    assert con2.execute("SELECT count(*) FROM collperf_instances").fetchone()[0] == 0
    assert con2.execute("SELECT severity FROM findings WHERE analyzer = 'collperf'").fetchall() == [("not_measurable",)]


def test_send_recv_exits_link_clocks_only_where_no_symmetric_collective_does(tmp_path, monkeypatch):
    con, run_id = _two_hosts(tmp_path)
    p2p = []
    for i, lag in enumerate([-50, -40, -60]):  # exact-looking but send/recv: a weaker kind of evidence
        t = 100_000 + 10_000 * i
        p2p += [{"rank": 1, "op": "send", "pg_name": "9", "pg_ranks": [1, 3], "seq": i, "step": 1, "arrival": t, "end": t + 900},
                {"rank": 3, "op": "recv", "pg_name": "9", "pg_ranks": [1, 3], "seq": i, "step": 1,
                 "arrival": t - 500 + AHEAD_NS, "end": t + 900 + AHEAD_NS + lag}]
    add_calls(con, run_id, p2p)
    crossrank(con, run_id, monkeypatch, ["match", "clock"])
    assert _hosts(con, run_id)[1] == ("b", [2, 3], -AHEAD_NS + 50, 15, "p2p_exits", "a", 0, 3)

    _add_all_reduces(con, run_id, [20, 40, 0])  # noisier (MAD 20), yet a symmetric collective wins
    crossrank(con, run_id, monkeypatch, ["match", "clock"])
    assert _hosts(con, run_id)[1] == ("b", [2, 3], -AHEAD_NS - 20, 30, "exits", "a", 0, 6)


def _synthetic(tmp_path_factory, scenario, hosts_known: bool):
    from bprof.store.ingest import IngestOptions, ingest_paths
    from bprof.synth import write_run

    out = tmp_path_factory.mktemp("synth")
    truth = write_run(scenario, out / "run")
    con = open_store(out / "s.duckdb")
    [r] = ingest_paths(con, [out / "run"], IngestOptions(name="synth"))
    if hosts_known:  # synthetic traces name their host as bprof record stores it
        assert con.execute("SELECT list(DISTINCT host ORDER BY host) FROM ranks").fetchone()[0] == [h["host"] for h in truth["hosts"]]
    else:  # as in traces without host names: every rank is its own clock
        con.execute("UPDATE ranks SET host = NULL WHERE run_id = ?", [r.run_id])
    saved = analysis.ANALYZERS
    analysis.ANALYZERS = CROSSRANK
    try:
        analysis.analyze_run(con, r.run_id, Options())
    finally:
        analysis.ANALYZERS = saved
    return con, r.run_id, truth


def _offset_errors_ns(con, run_id, truth) -> dict[int, int]:
    """Per rank: estimated offset minus the planted one. Truth: written = true + host offset, so the offset
    that aligns a rank with rank 0's host is -(its host's offset - rank 0's host's offset)."""
    planted = {r: h["clock_offset_ns"] for h in truth["hosts"] for r in h["ranks"]}
    got = dict(con.execute("SELECT rank, clock_offset_ns FROM ranks WHERE run_id = ?", [run_id]).fetchall())
    return {r: got[r] - (planted[0] - planted[r]) for r in planted}


JITTER_NS = 5_000
TOLERANCE_NS = 20_000


@pytest.mark.parametrize("hosts_known", [False, True], ids=["rank_clocks", "host_clocks"])
def test_planted_offsets_across_a_pipeline_come_back_within_20us(tmp_path_factory, hosts_known):
    """tp2 x pp2 x dp2 on 2 hosts: each host is one pipeline stage, so only send/recv cross hosts."""
    from bprof.synth import Fault, Scenario

    con, run_id, truth = _synthetic(tmp_path_factory, Scenario(
        tp=2, pp=2, dp=2, steps=2, hosts=2, clock_offset_ns={0: 0, 1: 350_000}, clock_jitter_ns=JITTER_NS, seed=3,
        faults=[Fault("slow_rank", rank=3, extra_ns=5_000_000)]), hosts_known)
    errors = _offset_errors_ns(con, run_id, truth)
    assert max(abs(e) for e in errors.values()) <= TOLERANCE_NS, errors
    methods = {m for (m,) in con.execute("SELECT method FROM clock_hosts WHERE run_id = ?", [run_id]).fetchall()}
    assert "p2p_exits" in methods  # the stages' clocks are linked by send/recv exits only
    assert con.execute("SELECT count(*) FROM clock_hosts WHERE run_id = ?", [run_id]).fetchone()[0] == (2 if hosts_known else 8)


def test_planted_offsets_of_four_hosts_come_back_from_all_reduce_exits_despite_a_straggler(tmp_path_factory):
    """tp2 x dp4 on 4 hosts: the DP all-reduces span every host; rank 5 is 5 ms slow every step, so it
    arrives last at its DP all-reduces, which must not move the offsets (exits are symmetric, arrivals are not)."""
    from bprof.synth import Fault, Scenario

    planted = {0: 0, 1: 350_000, 2: -1_200_000, 3: 40_000}
    con, run_id, truth = _synthetic(tmp_path_factory, Scenario(
        tp=2, pp=1, dp=4, steps=3, hosts=4, clock_offset_ns=planted, clock_jitter_ns=JITTER_NS, seed=11,
        faults=[Fault("slow_rank", rank=5, extra_ns=5_000_000)]), hosts_known=True)
    errors = _offset_errors_ns(con, run_id, truth)
    assert max(abs(e) for e in errors.values()) <= TOLERANCE_NS, errors
    assert [m for (m,) in con.execute("SELECT method FROM clock_hosts WHERE run_id = ? ORDER BY host", [run_id]).fetchall()] \
        == ["reference", "exits", "exits", "exits"]
    # the straggler is still found: wherever the planted arrivals leave a clear last rank (by more than the
    # clock error), the aligned arrivals name the same one; of the instances with rank 5, it is always rank 5
    got = {(pg, seq): last for pg, seq, last in con.execute(
        "SELECT pg_name, seq, last_rank FROM collperf_instances WHERE run_id = ? AND NOT is_p2p", [run_id]).fetchall()}
    clear = []
    for c in truth["collectives"]:
        second, last = sorted(m["arrival_ns"] for m in c["members"])[-2:]
        if last - second > 2 * TOLERANCE_NS:
            clear.append((5 in c["ranks"], c["last_rank"], got[(c["pg_name"], c["seq"])]))
    assert all(want == have for _, want, have in clear)
    with_straggler = [have for has_5, _, have in clear if has_5]
    assert len(with_straggler) > 100 and set(with_straggler) == {5}




@pytest.mark.slow
def test_real_two_host_recording_with_a_clock_5s_ahead(tmp_path):
    """Two torchrun agents on localhost under bprof record, the second posing as another host whose clock is
    5 s ahead (the recorder's test-only shift); DP over all 4 ranks, so gloo all-reduces cross the hosts.
    Both share one physical clock, so the true offset is exactly -5 s."""
    shift_ns = 5_000_000_000
    record_two_hosts(tmp_path, TRAINER, ["--tp", "1", "--dp", "4", "--steps", "5"], shift_ns=shift_ns)
    con = open_store(tmp_path / "s.duckdb")
    [(run_id,)] = con.execute("SELECT run_id FROM runs").fetchall()
    saved = analysis.ANALYZERS
    analysis.ANALYZERS = ["timeline", *CROSSRANK]
    try:
        analysis.analyze_run(con, run_id, Options())
    finally:
        analysis.ANALYZERS = saved
    [(host, offset_ns, residual_ns, method)] = con.execute(
        "SELECT host, offset_ns, residual_ns, method FROM clock_hosts WHERE run_id = ? AND method <> 'reference'", [run_id]).fetchall()
    assert host == "fakehost-b" and method in ("samples", "samples+exits")
    assert abs(offset_ns + shift_ns) <= residual_ns, (offset_ns, residual_ns)
    # aligned, the 5 s are gone: every DP all-reduce's members arrive within one step of each other
    steps_ns = con.execute("SELECT max(dur_ns) FROM steps WHERE run_id = ?", [run_id]).fetchone()[0]
    skews = [s for (s,) in con.execute("SELECT skew_ns FROM collperf_instances WHERE run_id = ?", [run_id]).fetchall()]
    assert skews and max(skews) < steps_ns
    # waits come back on each rank's own clock: inside that rank's own step spans
    outside = con.execute("""
        SELECT count(*) FROM collperf_waits w
        WHERE w.run_id = ? AND NOT EXISTS (SELECT 1 FROM timeline_spans s WHERE s.run_id = w.run_id AND s.rank = w.rank
                                           AND w.ts_ns >= s.ts_ns AND w.end_ns <= s.ts_ns + s.dur_ns)""", [run_id]).fetchone()[0]
    assert outside == 0
