"""truth.json agrees with the files, obeys the physical rules, and is reproducible."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from bprof.synth import Scenario, write_run
from tests.synth.read import load, raw, recount, to_ns


def test_truth_counts_equal_counts_in_the_files(any_run):
    for r in any_run.truth["ranks"]:
        counts, mine = r["counts"], recount(any_run.traces[r["rank"]])
        for key, value in mine.items():
            assert counts[key] == value, key
        assert "wait" not in counts["collectives_by_op"]
    modern = any_run.sc.fmt == "modern"
    totals = any_run.truth["ranks"][0]["counts"]
    assert (totals["num_wait"] > 0) == modern
    assert (totals["num_cuda_graph_launches"] > 0) == modern


def test_truth_describes_the_layout(modern_run):
    t = modern_run.truth
    assert t["world_size"] == 8 and t["ranks_per_host"] == 4 and t["format"] == "modern"
    for r in t["ranks"]:
        rank = r["rank"]
        assert r["local_rank"] == rank % 4 and r["host"] == f"node{rank // 4}"
        assert (r["tp_index"], r["dp_index"], r["pp_stage"]) == (rank % 2, rank // 2 % 2, rank // 4)
        assert r["steps"] == [5, 6] and len(r["step_dur_ns"]) == 2
        assert r["clock_offset_ns"] == (350_000 if rank >= 4 else 0)
    assert [h["clock_offset_ns"] for h in t["hosts"]] == [0, 350_000]
    assert t["scenario"]["faults"][0]["kind"] == "slow_rank"


def test_no_member_ends_before_the_last_arrival(any_run):
    colls = any_run.truth["collectives"]
    ops = {c["op"] for c in colls}
    assert ops >= {"allreduce", "broadcast", "p2p"}
    assert ("reduce_scatter" in ops and "allgather" in ops) == (any_run.sc.dp_mode == "zero1")
    for c in colls:
        arrivals = [m["arrival_ns"] for m in c["members"]]
        assert c["last_arrival_ns"] == max(arrivals)
        assert sorted(m["rank"] for m in c["members"]) == sorted(c["ranks"])
        for m in c["members"]:
            assert m["end_ns"] > c["last_arrival_ns"] >= m["arrival_ns"]
        if "src" in c:  # the receiver finishes only after the matching send started
            send = next(m for m in c["members"] if m["rank"] == c["src"])
            recv = next(m for m in c["members"] if m["rank"] == c["dst"])
            assert send["op"] == "send" and recv["op"] == "recv"
            assert recv["end_ns"] > send["arrival_ns"]


def _nccl_kernels(trace):
    return [e for e in trace["traceEvents"]
            if e.get("cat") == "kernel" and e["name"].startswith("nccl")]


def test_written_nccl_kernels_are_true_times_on_each_hosts_clock(any_run):
    """Written = true + host offset (+ wander <= jitter): offsets are applied per host."""
    jitter = any_run.sc.clock_jitter_ns
    members = defaultdict(list)
    for c in any_run.truth["collectives"]:
        for m in c["members"]:
            members[m["rank"]].append((m["arrival_ns"], m["end_ns"]))
    for r in any_run.truth["ranks"]:
        trace = any_run.traces[r["rank"]]
        kernels = sorted(_nccl_kernels(trace), key=lambda e: (e["ts"], e["dur"]))
        truth = sorted(members[r["rank"]])
        assert len(kernels) == len(truth) > 0
        for k, (arrival, end) in zip(kernels, truth):
            start = to_ns(trace, k["ts"])
            # 2022 writes whole µs, so allow the truncation there.
            slack = jitter + (1 if "baseTimeNanoseconds" in trace else 1000)
            assert abs(start - (arrival + r["clock_offset_ns"])) <= slack
            assert abs(start + round(k["dur"] * 1000) - (end + r["clock_offset_ns"])) <= \
                slack + 1000 * ("baseTimeNanoseconds" not in trace)


def test_p2p_across_hosts_shows_the_clock_offset(modern_run):
    """A send on host 0 and its recv on host 1 end together in true time; written, the
    receiver's clock reads 350 µs later."""
    t = modern_run.truth
    kernels = {r: {(k["args"]["Process Group Name"], k["args"]["Collective name"],
                    k["args"]["Seq"]): k for k in _nccl_kernels(modern_run.traces[r])}
               for r in range(8)}
    checked = 0
    for c in t["collectives"]:
        if "src" not in c or c["src"] >= 4 or c["dst"] < 4:
            continue
        ends = {}
        for m in c["members"]:
            k = kernels[m["rank"]][(c["pg_name"], m["op"], m["seq"])]
            trace = modern_run.traces[m["rank"]]
            ends[m["rank"]] = to_ns(trace, k["ts"]) + round(k["dur"] * 1000)
        skew = ends[c["dst"]] - ends[c["src"]]
        assert abs(skew - 350_000) <= 2 * 2_000 + 2 * 2_000 + 2  # wander on both + end jitter
        checked += 1
    assert checked > 0


def test_profiler_steps_match_the_truth(any_run):
    jitter = any_run.sc.clock_jitter_ns
    for r in any_run.truth["ranks"]:
        trace = any_run.traces[r["rank"]]
        steps = sorted((e for e in trace["traceEvents"]
                        if e.get("name", "").startswith("ProfilerStep#")), key=lambda e: e["ts"])
        assert [int(e["name"].split("#")[1]) for e in steps] == r["steps"]
        for e, ts, dur in zip(steps, r["step_ts_ns"], r["step_dur_ns"]):
            assert abs(to_ns(trace, e["ts"]) - ts - r["clock_offset_ns"]) <= jitter + 1000
            assert abs(round(e["dur"] * 1000) - dur) <= 2 * jitter + 2000


def test_same_seed_gives_identical_bytes_and_another_seed_differs(tmp_path):
    sc = Scenario(tp=2, pp=2, dp=1, steps=1, layers=2, microbatches=2, hosts=2,
                  clock_offset_ns={1: 12_345}, clock_jitter_ns=500, seed=11)
    write_run(sc, tmp_path / "a")
    write_run(sc, tmp_path / "b")
    write_run(replace(sc, seed=12), tmp_path / "c")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert names == ["rank0.json.gz", "rank1.json.gz", "rank2.json.gz", "rank3.json.gz",
                     "truth.json"]
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert raw(tmp_path / "a" / "rank0.json.gz") != raw(tmp_path / "c" / "rank0.json.gz")
    assert load(tmp_path / "a" / "truth.json") != load(tmp_path / "c" / "truth.json")


def test_rewriting_a_directory_leaves_only_the_new_run(tmp_path):
    write_run(Scenario(tp=1, pp=1, dp=4, steps=1, layers=1, microbatches=1), tmp_path)
    (tmp_path / "notes.txt").write_text("kept")
    write_run(Scenario(tp=1, pp=1, dp=2, steps=1, layers=1, microbatches=1), tmp_path, gzip=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "rank0.json", "rank1.json",
                                                         "truth.json"]
