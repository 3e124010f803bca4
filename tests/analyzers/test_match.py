"""Cross-rank matching of collectives on tiny hand-built tables (exact rows), and on a synthetic run
whose every planted instance must come back complete."""

import json

import pytest

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from tests.analyzers.tables import tiny_store

CROSSRANK = ["match", "clock", "collperf"]
_CALL_DEFAULTS = {"raw_name": "c10d::allreduce_", "source": "c10d", "is_p2p": False, "peer_rank": None,
                  "pg_name": "0", "pg_desc": "default_pg", "pg_ranks": [0, 1], "group_size": None, "seq": None,
                  "dtype": "Float", "in_elems": 256, "out_elems": None, "num_parts": 1, "tid": "1",
                  "cpu_ts_ns": None, "cpu_dur_ns": 5, "device_ts_ns": None, "device_dur_ns": None,
                  "num_kernels": 1, "external_id": None, "step": None}
_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Long": 8}


def add_calls(con, run_id, calls):
    """Insert collectives rows: dicts with at least rank and op; call_index counts on per rank in list order.
    Times: `arrival`/`end` set device_ts_ns/device_dur_ns (own clock); cpu_ts_ns defaults to arrival - 10."""
    index = dict(con.execute("SELECT rank, max(call_index) + 1 FROM collectives WHERE run_id = ? GROUP BY rank",
                             [run_id]).fetchall())
    for c in calls:
        c = {**_CALL_DEFAULTS, **c}
        c["is_p2p"] = c["op"] in ("send", "recv")
        c["group_size"] = c["group_size"] or (len(c["pg_ranks"]) if c["pg_ranks"] else None)
        if "arrival" in c:
            c["device_ts_ns"] = c.pop("arrival")
            c["device_dur_ns"] = c.pop("end") - c["device_ts_ns"] if "end" in c else 10
        if c["cpu_ts_ns"] is None:
            c["cpu_ts_ns"] = (c["device_ts_ns"] or 0) - 10
        size = _BYTES.get(c["dtype"], 4)
        in_bytes = c["in_elems"] * size if c["in_elems"] is not None else None
        out_bytes = c["out_elems"] * size if c["out_elems"] is not None else None
        i = index.get(c["rank"], 0)
        index[c["rank"]] = i + 1
        con.execute("""INSERT INTO collectives VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?,
                       ?, ?, ?, ?, ?, ?, ?)""",
                    [run_id, c["rank"], i, c["op"], c["raw_name"], c["source"], c["is_p2p"], c["peer_rank"],
                     c["pg_name"], c["pg_desc"], c["pg_ranks"], c["group_size"], c["seq"], c["dtype"], c["in_elems"],
                     c["out_elems"], in_bytes, out_bytes, c["num_parts"], c["tid"], c["cpu_ts_ns"], c["cpu_dur_ns"],
                     c["device_ts_ns"], c["device_dur_ns"], c["num_kernels"], c["external_id"], c["step"]])


def rows(con, sql, *params):
    cur = con.execute(sql, list(params))
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def crossrank(con, run_id, monkeypatch, analyzers=("match",)):
    monkeypatch.setattr(analysis, "ANALYZERS", list(analyzers))
    analysis.analyze_run(con, run_id, Options())


def _instances(con, run_id):
    """Instances in instance_id order (by group, then seq), without the packed id itself."""
    return [(r["op"], r["seq"], r["src_rank"], r["dst_rank"], r["step"], r["num_members"],
             r["status"], r["missing_ranks"], r["cut_ranks"]) for r in rows(con, """
        SELECT * FROM match_instances WHERE run_id = ? ORDER BY instance_id""", run_id)]


def _findings(con, run_id, analyzer="match"):
    return [(r["severity"], r["title"], json.loads(r["evidence"])) for r in rows(
        con, "SELECT * FROM findings WHERE run_id = ? AND analyzer = ? ORDER BY finding_id", run_id, analyzer)]


def test_members_of_each_seq_make_one_instance_with_own_and_no_aligned_times(tmp_path, monkeypatch):
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=2, steps=[(0, 1, 0, 1000), (1, 1, 0, 1000)])
    add_calls(con, run_id, [
        {"rank": 0, "op": "all_reduce", "seq": 7, "step": 1, "arrival": 100, "end": 300},
        {"rank": 0, "op": "all_reduce", "seq": 8, "step": 1, "arrival": 400, "end": 500},
        {"rank": 1, "op": "all_reduce", "seq": 7, "step": 1, "arrival": 200, "end": 301},
        {"rank": 1, "op": "all_reduce", "seq": 8, "step": 1, "cpu_ts_ns": 390},  # no device work: CPU arrival, no end
    ])
    crossrank(con, run_id, monkeypatch)
    assert _instances(con, run_id) == [("all_reduce", 7, None, None, 1, 2, "complete", [], []),
                                       ("all_reduce", 8, None, None, 1, 2, "complete", [], [])]
    assert [(r["bytes"], r["timing"], r["reason"]) for r in rows(con, "SELECT * FROM match_instances ORDER BY instance_id")] \
        == [(1024, "device", None), (1024, "cpu", None)]
    # aligned times: none before the clock analyzer has run
    assert [tuple(r.values()) for r in rows(con, """SELECT i.seq, m.* EXCLUDE (run_id, instance_id) FROM match_members_aligned m
                                                    JOIN match_instances i USING (run_id, instance_id) ORDER BY seq, rank""")] \
        == [(7, 0, 0, 1, 100, 300, None, None), (7, 1, 0, 1, 200, 301, None, None),
            (8, 0, 1, 1, 400, 500, None, None), (8, 1, 1, 1, 390, None, None, None)]
    assert _findings(con, run_id) == []


def test_calls_outside_a_members_traced_steps_are_cut_not_mismatched(tmp_path, monkeypatch):
    # rank 0 traced steps 1-2, rank 1 steps 2-3: only step 2 is common
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=2,
                             steps=[(0, 1, 0, 100), (0, 2, 100, 100), (1, 2, 100, 100), (1, 3, 200, 100)])
    add_calls(con, run_id, [
        {"rank": 0, "op": "all_reduce", "seq": 1, "step": 1, "arrival": 10},
        {"rank": 0, "op": "all_reduce", "seq": 2, "step": 2, "arrival": 110},
        {"rank": 1, "op": "all_reduce", "seq": 2, "step": 2, "arrival": 120},
        {"rank": 1, "op": "all_reduce", "seq": 3, "step": 3, "arrival": 210},
        {"rank": 1, "op": "all_reduce", "seq": 4, "step": None, "arrival": 310},  # after its last step
    ])
    crossrank(con, run_id, monkeypatch)
    assert _instances(con, run_id) == [
        ("all_reduce", 1, None, None, 1, 1, "cut", [], [1]),
        ("all_reduce", 2, None, None, 2, 2, "complete", [], []),
        ("all_reduce", 3, None, None, 3, 1, "cut", [], [0]),
        ("all_reduce", 4, None, None, None, 1, "cut", [], [0]),
    ]
    assert rows(con, "SELECT reason FROM match_instances WHERE seq = 1")[0]["reason"] \
        == "cut by the trace window: rank 1 outside its traced steps"
    assert _findings(con, run_id) == []


def test_a_member_missing_within_the_common_window_is_a_critical_finding(tmp_path, monkeypatch):
    ranks3 = [0, 1, 2]
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=3, steps=[(r, s, s * 100, 100) for r in ranks3 for s in (1, 2)])
    calls = [{"rank": r, "op": "all_reduce", "pg_ranks": ranks3, "seq": s, "step": s, "arrival": s * 100 + 10}
             for s in (1, 2) for r in ranks3 if (r, s) != (2, 2)]  # rank 2 never calls seq 2
    calls += [{"rank": r, "op": "broadcast", "pg_ranks": ranks3, "seq": 3, "step": 2, "arrival": 250,
               "in_elems": 64 if r == 1 else 32} for r in ranks3]  # rank 1 broadcasts another size
    add_calls(con, run_id, calls)
    crossrank(con, run_id, monkeypatch)
    assert _instances(con, run_id) == [("all_reduce", 1, None, None, 1, 3, "complete", [], []),
                                       ("all_reduce", 2, None, None, 2, 2, "mismatch", [2], []),
                                       ("broadcast", 3, None, None, 2, 3, "mismatch", [], [])]
    reasons = [r["reason"] for r in rows(con, "SELECT reason FROM match_instances WHERE status = 'mismatch' ORDER BY instance_id")]
    assert reasons == ["ranks [2] missing within the steps every member traced", "different sizes [32, 64] elements"]
    [missing, sizes] = _findings(con, run_id)
    assert missing[0] == "critical" and "Ranks [2] never called 1 all_reduce on group 0 (default_pg)" in missing[1]
    assert {k: missing[2][k] for k in ("ranks", "pg_name", "pg_ranks", "seqs", "steps")} == \
        {"ranks": [2], "pg_name": "0", "pg_ranks": [0, 1, 2], "seqs": [2], "steps": [2]}
    assert sizes[0] == "warning" and sizes[2]["seqs"] == [3]


def test_p2p_pairs_by_sender_receiver_and_seq_or_by_order_within_the_step(tmp_path, monkeypatch):
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=4, steps=[(r, 1, 0, 1000) for r in range(4)])
    pp = {"pg_name": "9", "pg_desc": "PIPELINE_MODEL_PARALLEL_GROUP"}
    add_calls(con, run_id, [
        # a 4-rank group: peers from peer_rank, messages numbered per (sender, receiver) as bprof record does
        {"rank": 0, "op": "send", "peer_rank": 1, "pg_ranks": [0, 1, 2, 3], "seq": 0, "step": 1, "arrival": 10, **pp},
        {"rank": 0, "op": "send", "peer_rank": 2, "pg_ranks": [0, 1, 2, 3], "seq": 0, "step": 1, "arrival": 20, **pp},
        {"rank": 1, "op": "recv", "peer_rank": 0, "pg_ranks": [0, 1, 2, 3], "seq": 0, "step": 1, "arrival": 5, **pp},
        {"rank": 2, "op": "recv", "peer_rank": 0, "pg_ranks": [0, 1, 2, 3], "seq": 0, "step": 1, "arrival": 6, **pp},
        # a 2-rank group without seq or peer_rank: the other rank is the peer, the k-th message of the step pairs
        {"rank": 2, "op": "send", "pg_name": "4", "pg_ranks": [2, 3], "step": 1, "arrival": 100},
        {"rank": 2, "op": "send", "pg_name": "4", "pg_ranks": [2, 3], "step": 1, "arrival": 200},
        {"rank": 3, "op": "recv", "pg_name": "4", "pg_ranks": [2, 3], "step": 1, "arrival": 90},
        {"rank": 3, "op": "recv", "pg_name": "4", "pg_ranks": [2, 3], "step": 1, "arrival": 210},
        {"rank": 3, "op": "send", "pg_name": "4", "pg_ranks": [2, 3], "step": 1, "arrival": 300},  # nobody receives it
        # a 4-rank group without peer_rank: the receiver cannot be known
        {"rank": 1, "op": "send", "pg_name": "8", "pg_ranks": [0, 1, 2, 3], "seq": 5, "step": 1, "arrival": 400},
    ])
    crossrank(con, run_id, monkeypatch)
    assert _instances(con, run_id) == [
        ("p2p", None, 2, 3, 1, 2, "complete", [], []),
        ("p2p", None, 2, 3, 1, 2, "complete", [], []),
        ("p2p", None, 3, 2, 1, 1, "mismatch", [2], []),
        ("p2p", 5, 1, None, 1, 1, "unknown", [], []),
        ("p2p", 0, 0, 1, 1, 2, "complete", [], []),
        ("p2p", 0, 0, 2, 1, 2, "complete", [], []),
    ]
    pairs = [(r["rank"], r["arrival_ts_ns"]) for r in rows(con, """
        SELECT m.* FROM match_members m JOIN match_instances i USING (run_id, instance_id)
        WHERE i.pg_name = '4' AND i.src_rank = 2 ORDER BY instance_id, rank""")]
    assert pairs == [(2, 100), (3, 90), (2, 200), (3, 210)]  # the k-th send with the k-th receive
    [(unknown, title, evidence), (severity, _, missing)] = _findings(con, run_id)
    assert severity == "critical" and (missing["src_rank"], missing["dst_rank"], missing["ranks"]) == (3, 2, [2])
    # the send without a peer: reported with its count, no time claimed
    assert unknown == "warning" and title == "1 send/recv calls on group 8 (default_pg) stay unmatched: their peer is unknown"
    assert (evidence["num_calls"], evidence["ranks"]) == (1, [1])


def test_groups_over_the_same_ranks_keep_their_own_sequence_numbers(tmp_path, monkeypatch):
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=2, steps=[(r, 1, 0, 1000) for r in range(2)])
    add_calls(con, run_id, [
        {"rank": r, "op": op, "pg_name": name, "pg_desc": desc, "seq": 1, "step": 1, "arrival": 10 * i}
        for i, (name, desc, op) in enumerate([("1", "DATA_PARALLEL_GROUP", "all_reduce"),
                                              ("2", "DATA_PARALLEL_GROUP_GLOO", "all_gather")])
        for r in range(2)])
    crossrank(con, run_id, monkeypatch)
    assert [(r["pg_name"], r["op"], r["status"]) for r in rows(con, "SELECT * FROM match_instances ORDER BY instance_id")] \
        == [("1", "all_reduce", "complete"), ("2", "all_gather", "complete")]


def test_calls_without_a_group_name_match_by_their_group_ranks_apart_from_named_groups(tmp_path, monkeypatch):
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=3, steps=[(r, 1, 0, 1000) for r in range(3)])
    add_calls(con, run_id, [
        {"rank": r, "op": op, "pg_name": name, "pg_ranks": ranks, "step": 1, "arrival": 10 * i}
        for i, (name, ranks, op) in enumerate([(None, [0, 1], "all_reduce"), (None, [1, 2], "broadcast"),
                                               ("7", [0, 1], "all_gather"), (None, [0, 1], "all_reduce")])
        for r in ranks])
    crossrank(con, run_id, monkeypatch)
    got = [(r["pg_name"], r["pg_ranks"], r["op"], r["num_members"], r["status"])
           for r in rows(con, "SELECT * FROM match_instances ORDER BY instance_id")]
    assert got == [("7", [0, 1], "all_gather", 2, "complete"),
                   (None, [0, 1], "all_reduce", 2, "complete"), (None, [0, 1], "all_reduce", 2, "complete"),
                   (None, [1, 2], "broadcast", 2, "complete")]


def test_bytes_follow_the_nccl_tests_conventions(tmp_path, monkeypatch):
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=2, steps=[(r, 1, 0, 1000) for r in range(2)])
    calls = [
        ("all_reduce", 100, 100), ("all_gather", 100, 200), ("reduce_scatter", 200, 100), ("broadcast", 100, 100),
        ("all_to_all", 100 + 0, 90), ("barrier", None, None),
    ]
    add_calls(con, run_id, [{"rank": r, "op": op, "seq": i, "step": 1, "arrival": i * 10,
                             "in_elems": (None if n_in is None else n_in + (50 * r if op == "all_to_all" else 0)),
                             "out_elems": n_out}
                            for i, (op, n_in, n_out) in enumerate(calls) for r in range(2)])
    add_calls(con, run_id, [{"rank": 0, "op": "send", "pg_ranks": [0, 1], "seq": 9, "step": 1, "in_elems": 10, "arrival": 1},
                            {"rank": 1, "op": "recv", "pg_ranks": [0, 1], "seq": 9, "step": 1, "in_elems": 10, "arrival": 1}])
    crossrank(con, run_id, monkeypatch)
    got = {r["op"]: (r["bytes"], r["status"]) for r in rows(con, "SELECT * FROM match_instances")}
    # Float: 4 bytes; all_gather by its output, reduce_scatter by its input, all_to_all the mean sent
    assert got == {"all_reduce": (400, "complete"), "all_gather": (800, "complete"), "reduce_scatter": (800, "complete"),
                   "broadcast": (400, "complete"), "all_to_all": (500, "complete"), "barrier": (0, "complete"),
                   "p2p": (40, "complete")}


def test_a_traceless_rank_cuts_and_calls_without_group_are_not_measurable(tmp_path, monkeypatch):
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=2, world_size=3, steps=[(r, 1, 0, 1000) for r in range(2)])
    add_calls(con, run_id, [{"rank": r, "op": "all_reduce", "pg_ranks": [0, 1, 2], "seq": 1, "step": 1, "arrival": 5}
                            for r in range(2)])
    add_calls(con, run_id, [{"rank": 0, "op": "all_reduce", "pg_name": None, "pg_ranks": None, "step": 1, "arrival": 9}])
    crossrank(con, run_id, monkeypatch)
    assert _instances(con, run_id) == [("all_reduce", 1, None, None, 1, 2, "cut", [], [2])]
    # the rank's trace is missing: said so, never "cut by the trace window"
    [reason] = [r for (r,) in con.execute("SELECT reason FROM match_instances WHERE run_id = ?", [run_id]).fetchall()]
    assert reason == "the traces of ranks [2] are missing (no trace ingested)"
    [(severity, title, _)] = _findings(con, run_id)
    assert severity == "not_measurable" and title.startswith("1 collective calls have no process group")


def test_calls_outside_every_step_without_seq_match_in_order(tmp_path, monkeypatch):
    """The B200 vLLM TP=8 trace: collectives outside every ProfilerStep and without Seq crashed
    match with an INTEGER overflow (524287 << 16); they are matched by order on each rank."""
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=2)
    add_calls(con, run_id, [{"rank": r, "op": "all_gather", "step": None, "arrival": 100 * i + r}
                            for i in range(3) for r in range(2)])
    crossrank(con, run_id, monkeypatch)
    assert _instances(con, run_id) == [("all_gather", None, None, None, None, 2, "complete", [], [])] * 3
    assert [r["first_arrival_ts_ns"] for r in rows(con, "SELECT * FROM match_instances ORDER BY instance_id")] \
        == [0, 100, 200]


def test_large_step_numbers_without_seq_keep_each_step_apart(tmp_path, monkeypatch):
    """Step numbers past 2^19 (a long job profiled late) once wrapped into another step's key."""
    steps = (1_000_000, 1_000_000 + 524_288)  # equal modulo 2^19
    con, run_id = tiny_store(tmp_path / "s.duckdb", ranks=2,
                             steps=[(r, s, i * 1000, 1000) for r in range(2) for i, s in enumerate(steps)])
    add_calls(con, run_id, [{"rank": r, "op": "all_reduce", "step": s, "arrival": i * 1000 + 10 + r,
                             "in_elems": 100 * (i + 1)} for r in range(2) for i, s in enumerate(steps)])
    crossrank(con, run_id, monkeypatch)
    assert _instances(con, run_id) == [("all_reduce", None, None, None, s, 2, "complete", [], []) for s in steps]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from bprof.synth import Fault, Scenario

    from tests.analyzers import recorded

    scenario = Scenario(tp=2, pp=2, dp=2, steps=2, hosts=2, clock_offset_ns={0: 0, 1: 350_000},
                        clock_jitter_ns=5_000, seed=3, faults=[Fault("slow_rank", rank=3, extra_ns=5_000_000)])
    return recorded.synthetic(tmp_path_factory.mktemp("synth"), scenario, ["timeline", *CROSSRANK])


def test_every_planted_instance_is_matched_complete_with_its_members(synthetic):
    con, run_id, truth = synthetic
    got = {}
    for inst_id, pg_name, seq, src, dst, members in con.execute("""
            SELECT i.instance_id, i.pg_name, i.seq, i.src_rank, i.dst_rank, list(m.rank ORDER BY m.rank)
            FROM match_instances i JOIN match_members m USING (run_id, instance_id)
            WHERE i.run_id = ? AND i.status = 'complete' GROUP BY ALL""", [run_id]).fetchall():
        got[(pg_name, seq, src, dst)] = members
    want = {}
    for c in truth["collectives"]:
        seq = c["members"][0]["seq"]
        want[(c["pg_name"], seq, c.get("src"), c.get("dst"))] = sorted(m["rank"] for m in c["members"])
    assert got == want
    assert con.execute("SELECT count(*) FROM match_instances WHERE run_id = ? AND status <> 'complete'",
                       [run_id]).fetchone()[0] == 0
