"""Collective performance: exact skew, waits, transfer and nccl-tests bandwidths on hand-built
instances; waits handed back on each rank's own clock; expert imbalance; and waits, transfer times
and last ranks against a synthetic run's planted truth."""

import json
import statistics

import pytest

from tests.analyzers.tables import tiny_store
from tests.analyzers.test_clock import AHEAD_NS, _add_samples, _two_hosts
from tests.analyzers.test_match import CROSSRANK, add_calls, crossrank, rows

TOLERANCE_NS = 20_000  # the clock requirement: offsets within 20 us under 5 us jitter


def _one_host(tmp_path, n=3, steps=(1,)):
    return tiny_store(tmp_path / "s.duckdb", ranks=n, steps=[(r, s, s * 100_000, 100_000) for r in range(n) for s in steps])


def test_skew_waits_transfer_and_bandwidth_of_one_all_reduce_are_exact(tmp_path, monkeypatch):
    con, run_id = _one_host(tmp_path)
    ranks3 = [0, 1, 2]
    add_calls(con, run_id, [
        {"rank": r, "op": "all_reduce", "pg_ranks": ranks3, "seq": 1, "step": 1, "in_elems": 250_000,
         "arrival": a, "end": e} for r, a, e in ((0, 100, 1000), (1, 150, 1010), (2, 400, 990))])
    crossrank(con, run_id, monkeypatch, CROSSRANK)
    [i] = rows(con, "SELECT * EXCLUDE (run_id) FROM collperf_instances")
    assert (i["op"], i["step"], i["num_members"], i["bytes"], i["timing"], i["first_arrival_aligned_ns"],
            i["last_arrival_aligned_ns"], i["skew_ns"], i["last_rank"], i["end_aligned_ns"], i["transfer_ns"]) \
        == ("all_reduce", 1, 3, 1_000_000, "device", 100, 400, 300, 2, 1000, 600)
    assert i["algbw_bytes_per_s"] == pytest.approx(1e6 / 600e-9)
    assert i["busbw_factor"] == pytest.approx(4 / 3)  # nccl-tests all_reduce: 2(n-1)/n
    assert i["busbw_bytes_per_s"] == pytest.approx(1e6 / 600e-9 * 4 / 3)
    assert (i["spans_hosts"], i["link_peak_bytes_per_s"], i["busbw_peak_frac"]) == (False, None, None)
    assert i["wait_ns"] == 300 + 250  # rank 2 arrived last and waits 0
    assert [tuple(r.values()) for r in rows(con, "SELECT rank, step, ts_ns, end_ns FROM collperf_waits ORDER BY rank")] \
        == [(0, 1, 100, 400), (1, 1, 150, 400)]


def test_common_end_of_five_members_rounds_down_before_the_epoch_too(tmp_path, monkeypatch):
    con, run_id = _one_host(tmp_path, n=5)
    ends = [-1000, -998, -997, -997, -990]
    add_calls(con, run_id, [{"rank": r, "op": "all_reduce", "pg_ranks": list(range(5)), "seq": 1, "step": 1,
                             "arrival": -2000 - r, "end": e} for r, e in enumerate(ends)])
    crossrank(con, run_id, monkeypatch, CROSSRANK)
    [i] = rows(con, "SELECT end_aligned_ns, transfer_ns FROM collperf_instances")
    # the mean without the earliest and the latest end, -2992 / 3 = -997.3, rounded down (so that an
    # offset added to every end adds to it exactly): -998
    assert (i["end_aligned_ns"], i["transfer_ns"]) == (-998, 1002)
    [m] = rows(con, "SELECT end_ts_ns, last_arrival_ts_ns, last_rank, wait_ns FROM match_instances")
    assert (m["end_ts_ns"], m["last_arrival_ts_ns"], m["last_rank"], m["wait_ns"]) == (-998, -2000, 0, 1 + 2 + 3 + 4)


def test_busbw_factors_follow_nccl_tests_and_ties_name_the_lowest_rank(tmp_path, monkeypatch):
    con, run_id = _one_host(tmp_path, n=4)
    ops = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "barrier"]
    add_calls(con, run_id, [{"rank": r, "op": op, "pg_ranks": [0, 1, 2, 3], "seq": i, "step": 1, "in_elems": 1000,
                             "out_elems": 1000, "arrival": 1000 * i + (50 if r in (1, 3) else 0), "end": 1000 * i + 500}
                            for i, op in enumerate(ops) for r in range(4)])
    add_calls(con, run_id, [{"rank": 0, "op": "send", "pg_name": "p", "pg_ranks": [0, 1], "seq": 0, "step": 1, "in_elems": 1000,
                             "arrival": 9000, "end": 9500},
                            {"rank": 1, "op": "recv", "pg_name": "p", "pg_ranks": [0, 1], "seq": 0, "step": 1, "in_elems": 1000,
                             "arrival": 8000, "end": 9500}])
    crossrank(con, run_id, monkeypatch, CROSSRANK)
    got = {r["op"]: (r["busbw_factor"], r["last_rank"], r["transfer_ns"], r["busbw_bytes_per_s"] is None)
           for r in rows(con, "SELECT * FROM collperf_instances")}
    assert got == {"all_reduce": (1.5, 1, 450, False), "all_gather": (0.75, 1, 450, False),
                   "reduce_scatter": (0.75, 1, 450, False), "all_to_all": (0.75, 1, 450, False),
                   "broadcast": (1.0, 1, 450, False), "reduce": (1.0, 1, 450, False),
                   "barrier": (None, 1, 450, True), "p2p": (1.0, 0, 500, False)}
    busbw = {r["op"]: r["busbw_bytes_per_s"] for r in rows(con, "SELECT * FROM collperf_instances")}
    # all_gather moves its 4000-byte output: algbw 4000 B / 450 ns
    assert busbw["all_gather"] == pytest.approx(4000 / 450e-9 * 0.75)
    assert busbw["p2p"] == pytest.approx(4000 / 500e-9)


def test_waits_go_back_to_each_ranks_own_clock(tmp_path, monkeypatch):
    con, run_id = _two_hosts(tmp_path)  # host b (ranks 2, 3) is AHEAD_NS ahead, known from its clock samples
    _add_samples(con, run_id)
    add_calls(con, run_id, [  # true arrivals: rank 2 at 12_000, rank 0 at 20_000 (last); true end 25_000
        {"rank": 0, "op": "all_reduce", "pg_ranks": [0, 2], "seq": 1, "step": 1, "arrival": 20_000, "end": 25_000},
        {"rank": 2, "op": "all_reduce", "pg_ranks": [0, 2], "seq": 1, "step": 1,
         "arrival": 12_000 + AHEAD_NS, "end": 25_000 + AHEAD_NS}])
    crossrank(con, run_id, monkeypatch, CROSSRANK)
    [i] = rows(con, "SELECT * FROM collperf_instances")
    assert (i["skew_ns"], i["last_rank"], i["transfer_ns"], i["spans_hosts"]) == (8000, 0, 5000, True)
    assert [tuple(r.values()) for r in rows(con, "SELECT rank, ts_ns, end_ns FROM collperf_waits")] \
        == [(2, 12_000 + AHEAD_NS, 20_000 + AHEAD_NS)]


def test_groups_aggregate_by_op_and_power_of_two_size(tmp_path, monkeypatch):
    con, run_id = _one_host(tmp_path, n=2, steps=(1, 2))
    calls = []
    for seq, (elems, skew, transfer) in enumerate([(250_000, 100, 1000), (200_000, 300, 3000), (10, 50, 10)]):
        t = 100_000 * (1 + seq % 2)  # seqs 0, 2 in step 1; seq 1 in step 2
        calls += [{"rank": 0, "op": "all_reduce", "seq": seq, "step": 1 + seq % 2, "in_elems": elems, "arrival": t, "end": t + skew + transfer},
                  {"rank": 1, "op": "all_reduce", "seq": seq, "step": 1 + seq % 2, "in_elems": elems, "arrival": t + skew,
                   "end": t + skew + transfer}]
    add_calls(con, run_id, calls)
    crossrank(con, run_id, monkeypatch, CROSSRANK)
    got = [tuple(r.values()) for r in rows(con, """
        SELECT pg_name, pg_desc, pg_ranks, op, size_bucket_bytes, spans_hosts, num_instances, median_bytes, median_skew_ns,
               max_skew_ns, wait_ns, median_transfer_ns, transfer_ns FROM collperf_groups ORDER BY size_bucket_bytes""")]
    assert got == [("0", "default_pg", [0, 1], "all_reduce", 32, False, 1, 40, 50, 50, 50, 10, 10),
                   ("0", "default_pg", [0, 1], "all_reduce", 524_288, False, 2, 900_000, 200, 300, 400, 2000, 4000)]


def test_uneven_all_to_all_is_an_expert_imbalance_finding(tmp_path, monkeypatch):
    con, run_id = _one_host(tmp_path, n=4, steps=(1, 2))
    calls = []
    for seq, step in ((0, 1), (1, 1), (2, 2)):
        t = 100_000 * step + 10_000 * seq
        calls += [{"rank": r, "op": "all_to_all", "pg_name": "ep", "pg_desc": "EXPERT_MODEL_PARALLEL_GROUP",
                   "pg_ranks": [0, 1, 2, 3], "seq": seq, "step": step, "in_elems": 150,
                   "out_elems": 300 if r == 2 else 100, "arrival": t, "end": t + 1000} for r in range(4)]
    add_calls(con, run_id, calls)
    crossrank(con, run_id, monkeypatch, CROSSRANK)
    assert {r["member_bytes_imbalance_frac"] for r in rows(con, "SELECT * FROM collperf_instances")} == {0.5}
    [f] = rows(con, "SELECT * FROM findings WHERE analyzer = 'collperf'")
    # per step: transfer 1000 ns x 0.5 per instance; step 1 has two (1000 ns), step 2 one (500 ns): median 750
    assert f["lost_ns"] == 750 and "2.00x the mean" in f["title"] and "EXPERT" in f["title"]


def test_every_crossrank_table_documents_itself_and_keeps_ns_as_bigint(tmp_path, monkeypatch):
    con, run_id = _one_host(tmp_path)
    add_calls(con, run_id, [{"rank": r, "op": "all_reduce", "pg_ranks": [0, 1, 2], "seq": 1, "step": 1, "arrival": 5}
                            for r in range(3)])
    crossrank(con, run_id, monkeypatch, ["timeline", *CROSSRANK])
    crossrank(con, run_id, monkeypatch, ["timeline", *CROSSRANK])  # idempotent: a rerun replaces the rows
    from bprof.analyzers import clock, collperf, match

    tables = {t for (t,) in con.execute("""SELECT table_name FROM duckdb_tables() WHERE NOT temporary AND
                                           regexp_matches(table_name, '^(match|clock|collperf)_')""").fetchall()}
    ours = set(match.TABLES + clock.TABLES + collperf.TABLES)
    assert ours == {"match_instances", "match_members", "match_nameless_steps", "clock_hosts", "collperf_instances",
                    "collperf_waits", "collperf_groups"} and ours <= tables
    undocumented = con.execute("""
        SELECT table_name || coalesce('.' || column_name, '') FROM (
            SELECT table_name, NULL AS column_name, comment FROM duckdb_tables() WHERE NOT temporary
            UNION ALL SELECT table_name, column_name, comment FROM duckdb_columns() WHERE NOT internal)
        WHERE list_contains($1, table_name) AND (comment IS NULL OR comment = '')""", [sorted(ours)]).fetchall()
    wrong = con.execute("""SELECT table_name || '.' || column_name FROM duckdb_columns()
                           WHERE list_contains($1, table_name) AND column_name LIKE '%\\_ns' ESCAPE '\\'
                             AND data_type <> 'BIGINT'""", [sorted(ours)]).fetchall()
    no_run = ours - {t for (t,) in con.execute("SELECT table_name FROM duckdb_columns() WHERE column_name = 'run_id'").fetchall()}
    assert (undocumented, wrong, no_run) == ([], [], set())
    assert con.execute("SELECT count(*) FROM match_members").fetchone()[0] == 3


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    from bprof.synth import Fault, Scenario

    from tests.analyzers import recorded

    scenario = Scenario(tp=2, pp=2, dp=2, steps=2, hosts=2, clock_offset_ns={0: 0, 1: 350_000},
                        clock_jitter_ns=5_000, seed=3, faults=[Fault("slow_rank", rank=3, extra_ns=5_000_000)])
    return recorded.synthetic(tmp_path_factory.mktemp("synth"), scenario, CROSSRANK)


def _by_truth_key(con, run_id):
    """collperf rows keyed like truth.json's collectives: (pg_name, seq, src, dst); waits by (instance, rank),
    absent for a member that waited 0."""
    inst = {}
    for row in rows(con, """SELECT c.*, i.src_rank, i.dst_rank FROM collperf_instances c
                            JOIN match_instances i USING (run_id, instance_id) WHERE c.run_id = ?""", run_id):
        inst[(row["pg_name"], row["seq"], row["src_rank"], row["dst_rank"])] = row
    waits = {(i, r): w for i, r, w in con.execute(
        "SELECT instance_id, rank, end_ns - ts_ns FROM collperf_waits WHERE run_id = ?", [run_id]).fetchall()}
    return inst, waits


def test_waits_and_transfer_times_match_the_planted_ones(synthetic):
    con, run_id, truth = synthetic
    inst, waits = _by_truth_key(con, run_id)
    assert len(inst) == len(truth["collectives"])
    transfer_err, wait_err = [], []
    for c in truth["collectives"]:
        got = inst[(c["pg_name"], c["members"][0]["seq"], c.get("src"), c.get("dst"))]
        last = max(m["arrival_ns"] for m in c["members"])
        assert last == c["last_arrival_ns"]
        # the planted common end: members end at last arrival + transfer, each with its own jitter
        transfer_err.append(got["transfer_ns"] - (statistics.median(m["end_ns"] for m in c["members"]) - last))
        wait_err += [waits.get((got["instance_id"], m["rank"]), 0) - (last - m["arrival_ns"]) for m in c["members"]]
    assert max(map(abs, transfer_err)) <= TOLERANCE_NS and max(map(abs, wait_err)) <= TOLERANCE_NS
    # and the transfer is the planted one, up to the planted end jitter
    assert all(abs(inst[(c["pg_name"], c["members"][0]["seq"], c.get("src"), c.get("dst"))]["transfer_ns"] - c["transfer_ns"])
               <= TOLERANCE_NS + 5_000 for c in truth["collectives"])


def test_last_rank_is_the_planted_last_wherever_the_arrivals_tell_it_apart(synthetic):
    con, run_id, truth = synthetic
    inst, _ = _by_truth_key(con, run_id)
    clear = [(c, inst[(c["pg_name"], c["members"][0]["seq"], c.get("src"), c.get("dst"))]["last_rank"])
             for c in truth["collectives"]
             if (lambda a: a[-1] - a[-2])(sorted(m["arrival_ns"] for m in c["members"])) > 2 * TOLERANCE_NS]
    assert len(clear) > 100 and all(c["last_rank"] == got for c, got in clear)
    # the slow rank (3) arrives last at nearly every collective it shares with its TP and DP peers
    with_3 = [got for c, got in clear if 3 in c["ranks"] and c["op"] != "p2p"]
    assert len(with_3) > 50 and with_3.count(3) >= 0.9 * len(with_3)


def _timing(members):
    """(first, last, last rank, wait, common end) of (rank, arrival, end) members on one clock, by the
    definitions of instance_times.sql: ties name the lowest rank; the end is the median up to 4 members,
    beyond that the mean without the earliest and latest end, rounded down."""
    first, last = min(a for _, a, _ in members), max(a for _, a, _ in members)
    ends = sorted(e for _, _, e in members)
    if None in ends:
        end = None
    else:
        kept = ends if len(ends) <= 2 else ends[1:-1]
        end = sum(kept) // len(kept) if len(ends) > 4 else (kept[(len(kept) - 1) // 2] + kept[len(kept) // 2]) // 2 \
            if len(kept) % 2 == 0 else kept[len(kept) // 2]
    return first, last, min(r for r, a, _ in members if a == last), sum(last - a for _, a, _ in members), end


def test_one_clock_instances_take_matchs_timing_plus_the_offset_and_the_rest_their_members(synthetic):
    # two hosts 350 us apart: tensor-parallel instances within a host come from match's own-clock
    # timing plus the host's offset, the others from their members' aligned times; both must be what
    # the members say
    con, run_id, _ = synthetic
    members, own = {}, {}
    for inst, rank, arrival, end, a_own, e_own in con.execute(
            """SELECT instance_id, rank, arrival_aligned_ns, end_aligned_ns, arrival_ts_ns, end_ts_ns
               FROM match_members_aligned WHERE run_id = ?""", [run_id]).fetchall():
        members.setdefault(inst, []).append((rank, arrival, end))
        own.setdefault(inst, []).append((rank, a_own, e_own))
    hosts = dict(con.execute("SELECT rank, host FROM ranks WHERE run_id = ?", [run_id]).fetchall())
    one_host = {i: len({hosts[r] for r, _, _ in m}) == 1 for i, m in members.items()}
    assert 0 < sum(one_host.values()) < len(one_host)
    for i in rows(con, """SELECT instance_id, first_arrival_ts_ns, last_arrival_ts_ns, last_rank, wait_ns, end_ts_ns
                          FROM match_instances WHERE run_id = ?""", run_id):
        got = (i["first_arrival_ts_ns"], i["last_arrival_ts_ns"], i["last_rank"], i["wait_ns"], i["end_ts_ns"])
        assert got == (_timing(own[i["instance_id"]]) if one_host[i["instance_id"]] else (None,) * 5)
    checked = 0
    for c in rows(con, """SELECT instance_id, first_arrival_aligned_ns, last_arrival_aligned_ns, last_rank, wait_ns,
                                 end_aligned_ns FROM collperf_instances WHERE run_id = ?""", run_id):
        got = (c["first_arrival_aligned_ns"], c["last_arrival_aligned_ns"], c["last_rank"], c["wait_ns"], c["end_aligned_ns"])
        assert got == _timing(members[c["instance_id"]])
        checked += 1
    assert checked == len(members)


def test_busbw_is_compared_with_nvlink_within_a_host_and_the_given_nic_across_hosts(tmp_path, monkeypatch):
    from bprof.analyzers import run as analysis
    from bprof.analyzers.base import Options
    from tests.analyzers.test_kernels_metrics import A100

    con, run_id = _two_hosts(tmp_path)  # ranks 0, 1 on host a; 2, 3 on host b
    con.execute("UPDATE ranks SET device_index = 0, device_properties = ? WHERE run_id = ?", [json.dumps(A100), run_id])
    _add_samples(con, run_id)
    add_calls(con, run_id, [
        {"rank": r, "op": "all_reduce", "pg_name": "in_a", "pg_ranks": [0, 1], "seq": 1, "step": 1, "in_elems": 250_000,
         "arrival": 20_000, "end": 25_000} for r in (0, 1)] + [
        {"rank": r, "op": "all_reduce", "pg_name": "a_b", "pg_ranks": [0, 2], "seq": 1, "step": 1, "in_elems": 250_000,
         "arrival": 20_000 + (AHEAD_NS if r == 2 else 0), "end": 30_000 + (AHEAD_NS if r == 2 else 0)} for r in (0, 2)])
    monkeypatch.setattr(analysis, "ANALYZERS", list(CROSSRANK))
    sql = """SELECT spans_hosts, busbw_bytes_per_s, link_peak_bytes_per_s, busbw_peak_frac FROM collperf_instances
             ORDER BY spans_hosts"""
    for nic, inter_peak in ((None, None), (50e9, 50e9)):
        analysis.analyze_run(con, run_id, Options(nic_bytes_per_s=nic))
        intra, inter = rows(con, sql)
        # 1 MB all_reduce over 2 ranks in 5 us (10 us across hosts); A100 SXM NVLink: 300 GB/s each way
        assert (intra["spans_hosts"], intra["link_peak_bytes_per_s"]) == (False, 300e9)
        assert intra["busbw_peak_frac"] == pytest.approx(1e6 / 5e-6 / 300e9)
        assert (inter["spans_hosts"], inter["link_peak_bytes_per_s"]) == (True, inter_peak)
        assert inter["busbw_peak_frac"] == (None if nic is None else pytest.approx(1e6 / 10e-6 / 50e9))
    groups = {r["spans_hosts"]: (r["link_peak_bytes_per_s"], r["busbw_peak_frac"]) for r in rows(
        con, "SELECT spans_hosts, link_peak_bytes_per_s, busbw_peak_frac FROM collperf_groups")}
    assert groups == {False: (300e9, pytest.approx(1e6 / 5e-6 / 300e9)), True: (50e9, pytest.approx(1e6 / 10e-6 / 50e9))}


def test_a_synthetic_a100_run_gets_nvlink_within_hosts_and_no_guess_across(synthetic):
    # two hosts of A100 SXM; no --nic-gbps: collectives crossing hosts keep an unknown peak
    con, run_id, _ = synthetic
    got = {(spans, peak) for spans, peak in con.execute(
        "SELECT DISTINCT spans_hosts, link_peak_bytes_per_s FROM collperf_instances WHERE run_id = ?", [run_id]).fetchall()}
    assert got == {(False, 300e9), (True, None)}
    assert con.execute("""SELECT count(*) FROM collperf_instances WHERE run_id = ? AND NOT spans_hosts
                          AND busbw_bytes_per_s IS NOT NULL AND busbw_peak_frac IS NULL""", [run_id]).fetchone()[0] == 0
