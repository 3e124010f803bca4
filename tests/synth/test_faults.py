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


@pytest.mark.parametrize("kwargs", [
    {"kind": "bogus"},
    {"kind": "slow_rank", "extra_ns": 5},
    {"kind": "slow_host", "host": 0, "factor": 0.5},
    {"kind": "stalled_input"},
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
