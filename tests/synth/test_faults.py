"""Each planted fault leaves the trace marks truth.json says it does."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bprof.synth import Fault, Scenario, write_run
from tests.synth.read import interval, load


def _run(tmp_path, name, sc):
    truth = write_run(sc, tmp_path / name)
    return truth, {r["rank"]: load(tmp_path / name / r["file"]) for r in truth["ranks"]}


def _allreduce_ns(trace) -> int:
    return sum(round(e["dur"] * 1000) for e in trace["traceEvents"] if e.get("cat") == "kernel"
               and e["args"].get("Collective name") == "allreduce")


def test_slow_rank_makes_its_peers_wait_in_all_reduce(tmp_path):
    extra = 4_000_000
    base = Scenario(tp=2, pp=1, dp=2, steps=2, layers=2, microbatches=2, seed=5)
    slow = replace(base, faults=(Fault("slow_rank", rank=1, extra_ns=extra),))
    _, clean = _run(tmp_path, "clean", base)
    truth, faulty = _run(tmp_path, "slow", slow)
    for peer in (0, 2, 3):
        grown = _allreduce_ns(faulty[peer]) - _allreduce_ns(clean[peer])
        assert grown > 0.5 * extra * base.steps, peer
    assert _allreduce_ns(faulty[1]) < _allreduce_ns(clean[1])  # the slow rank waits less
    effect = truth["faults"][0]
    assert effect["counterfactual"]["compute_kernel_delta_ns_per_step"][1] == pytest.approx(extra)
    assert effect["counterfactual"]["compute_kernel_delta_ns_per_step"][0] == 0
    assert effect["expected"]["slow_rank"] == 1
    assert effect["expected"]["peer_wait_ns_per_step"] > 0.5 * extra
    assert effect["expected"]["slow_rank_wait_ns_per_step"] < 0


def test_stalled_input_is_a_cpu_gap_without_gpu_work(tmp_path):
    extra = 3_000_000
    sc = Scenario(tp=1, pp=1, dp=2, steps=3, layers=2, microbatches=1, seed=4,
                  faults=[Fault("stalled_input", rank=0, extra_ns=extra)])
    truth, traces = _run(tmp_path, "stall", sc)
    trace = traces[0]
    loads = [e for e in trace["traceEvents"] if e.get("name", "").startswith("enumerate(DataLoader)")]
    gpu = [interval(trace, e) for e in trace["traceEvents"]
           if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(loads) == 3
    for e in loads[1:]:  # the first step has nothing before it
        s, t = interval(trace, e)
        assert t - s > extra
        assert not any(a < t and s < b for a, b in gpu)
    delta = truth["faults"][0]["counterfactual"]["step_dur_delta_ns"]
    assert delta[0] == pytest.approx(extra, rel=0.05)
    assert truth["faults"][0]["counterfactual"]["nccl_wait_delta_ns_per_step"][1] > 0.5 * extra


def _dp_vs_gemms(trace):
    """Per step: (first DP bucket kernel start, last GEMM end)."""
    out = []
    for step in (e for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep")):
        s, t = interval(trace, step)
        inside = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"
                  and s <= interval(trace, e)[0] < t]
        dp = [interval(trace, e)[0] for e in inside
              if e["args"].get("Process Group Description") == "DATA_PARALLEL_GROUP"]
        gemm = [interval(trace, e)[1] for e in inside if "gemm" in e["name"]]
        out.append((min(dp), max(gemm)))
    return out


def test_exposed_comm_moves_dp_buckets_after_the_backward(tmp_path):
    base = Scenario(tp=1, pp=1, dp=2, steps=2, layers=6, microbatches=1, seed=6)
    truth, traces = _run(tmp_path, "exposed", replace(base, faults=(Fault("exposed_comm"),)))
    _, clean = _run(tmp_path, "overlapped", base)
    trace = traces[0]
    main = next(e["pid"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op")
    calls = [e for e in trace["traceEvents"] if e.get("name") == "record_param_comms"
             and e["args"].get("Process Group Description") == "DATA_PARALLEL_GROUP"]
    assert calls and all(e["tid"] == main for e in calls)  # issued from the main thread
    assert all(first_dp >= last_gemm for first_dp, last_gemm in _dp_vs_gemms(trace))
    assert all(first_dp < last_gemm for first_dp, last_gemm in _dp_vs_gemms(clean[0]))
    assert min(truth["faults"][0]["counterfactual"]["step_dur_delta_ns"]) > 1_000_000


def test_stage_imbalance_slows_the_last_stage_and_starves_the_first(tmp_path):
    sc = Scenario(tp=1, pp=2, dp=1, steps=2, layers=4, microbatches=4, seed=8,
                  faults=[Fault("stage_imbalance", factor=2.0)])
    truth, _ = _run(tmp_path, "imbalance", sc)
    cf = truth["faults"][0]["counterfactual"]
    assert cf["compute_kernel_delta_ns_per_step"][0] == 0
    assert cf["compute_kernel_delta_ns_per_step"][1] > 10_000_000
    assert cf["nccl_wait_delta_ns_per_step"][0] > 10_000_000  # stage 0 waits in recv
    assert min(cf["step_dur_delta_ns"]) > 10_000_000
    assert truth["faults"][0]["expected"]["stage"] == 1


def test_slow_host_slows_only_its_ranks(tmp_path):
    sc = Scenario(tp=1, pp=1, dp=4, steps=2, layers=2, microbatches=1, hosts=2, seed=9,
                  faults=[Fault("slow_host", host=1, factor=1.5)])
    truth, _ = _run(tmp_path, "host", sc)
    cf = truth["faults"][0]["counterfactual"]
    assert cf["compute_kernel_delta_ns_per_step"][:2] == [0, 0]
    assert all(d > 1_000_000 for d in cf["compute_kernel_delta_ns_per_step"][2:])
    assert all(d > 1_000_000 for d in cf["nccl_wait_delta_ns_per_step"][:2])
    assert truth["faults"][0]["ranks"] == [2, 3]


def _instance_key(c) -> tuple:
    """What names a collective instance in both a run and its fault-free twin."""
    return (c["op"], c["pg_name"], c["seq"], c.get("src"), c.get("dst"), c.get("pair_index"))


def test_slow_link_slows_exactly_the_inter_host_instances_of_its_host(tmp_path):
    # 2 ranks per host: DP groups (0, 2), (1, 3) and PP pairs (2, 6), (3, 7) touch node1 and
    # another host; TP pairs stay inside a host; DP (4, 6) and PP (0, 4) cross hosts elsewhere.
    base = Scenario(tp=2, pp=2, dp=2, steps=2, layers=2, microbatches=2, hosts=4, seed=10,
                    clock_jitter_ns=1_000)
    factor = 2.5
    truth, _ = _run(tmp_path, "link", replace(base, faults=(Fault("slow_link", host=1,
                                                                   factor=factor),)))
    clean, _ = _run(tmp_path, "clean", base)
    host_of = {r: h["host"] for h in truth["hosts"] for r in h["ranks"]}
    clean_transfer = {_instance_key(c): c["transfer_ns"] for c in clean["collectives"]}
    assert len(clean_transfer) == len(truth["collectives"])
    slowed, kinds = [], set()
    for i, c in enumerate(truth["collectives"]):
        hosts = {host_of[r] for r in c["ranks"]}
        before = clean_transfer[_instance_key(c)]
        if len(hosts) > 1 and "node1" in hosts:
            assert c["transfer_ns"] == pytest.approx(factor * before, abs=1)
            slowed.append(i)
            kinds.add((c["op"], c["pg_desc"]))
        else:
            assert c["transfer_ns"] == before, c
    assert kinds == {("allreduce", "DATA_PARALLEL_GROUP"), ("p2p", "PIPELINE_MODEL_PARALLEL_GROUP")}
    assert any(len({host_of[r] for r in c["ranks"]}) > 1 and "node1" not in
               {host_of[r] for r in c["ranks"]} for c in truth["collectives"])  # crossing elsewhere

    effect = truth["faults"][0]
    expected = effect["expected"]
    assert expected["collective_indices"] == slowed and expected["num_instances"] == len(slowed)
    assert expected["host"] == "node1" and expected["host_ranks"] == [2, 3]
    assert expected["transfer_factor_mean"] == pytest.approx(factor, rel=1e-6)
    assert effect["ranks"] == [0, 1, 2, 3, 6, 7]
    extra = sum(truth["collectives"][i]["transfer_ns"] for i in slowed) - sum(
        clean_transfer[_instance_key(truth["collectives"][i])] for i in slowed)
    assert expected["extra_transfer_ns_per_step"] == pytest.approx(extra / base.steps)
    # compute untouched, measured both ways; the slowed ranks' steps grow
    assert effect["counterfactual"]["compute_kernel_delta_ns_per_step"] == [0] * 8
    for got, want in zip(truth["ranks"], clean["ranks"]):
        assert got["step_compute_kernel_ns"] == want["step_compute_kernel_ns"]
    assert min(effect["counterfactual"]["step_dur_delta_ns"][r] for r in effect["ranks"]) > 0


def test_slow_link_run_is_byte_identical_for_the_same_seed(tmp_path):
    sc = Scenario(tp=1, pp=2, dp=2, steps=1, layers=2, microbatches=2, hosts=2, seed=4,
                  clock_offset_ns={1: 7_000}, clock_jitter_ns=500,
                  faults=[Fault("slow_link", host=0, factor=2.0)])
    write_run(sc, tmp_path / "a")
    write_run(sc, tmp_path / "b")
    for p in sorted((tmp_path / "a").iterdir()):
        assert p.read_bytes() == (tmp_path / "b" / p.name).read_bytes(), p.name


@pytest.mark.parametrize("kwargs", [
    {"kind": "bogus"},
    {"kind": "slow_rank", "extra_ns": 5},
    {"kind": "slow_host", "host": 0, "factor": 0.5},
    {"kind": "stalled_input"},
    {"kind": "slow_link", "factor": 2.0},
    {"kind": "slow_link", "host": 0, "factor": 1.0},
])
def test_bad_faults_are_rejected(kwargs):
    with pytest.raises(ValueError):
        Fault(**kwargs)


def test_bad_scenarios_are_rejected():
    with pytest.raises(ValueError):
        Scenario(tp=2, pp=2, dp=2, hosts=3)
    with pytest.raises(ValueError):
        Scenario(dp=2, faults=[Fault("slow_rank", rank=9, extra_ns=1)])
    with pytest.raises(ValueError):
        Scenario(dp=2, hosts=2, clock_offset_ns={2: 5})
    with pytest.raises(ValueError):  # one host: no inter-host link to slow
        Scenario(dp=2, hosts=1, faults=[Fault("slow_link", host=0, factor=2.0)])
