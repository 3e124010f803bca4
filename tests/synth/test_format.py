"""The written files look like real Kineto traces of their era, read back with gzip + json."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

from bprof.synth import Scenario, write_run
from tests.synth.read import (COLL_ARGS, KEYS_2022, MODERN_KEYS, TRIMONTH_NS, Timeline,
                              by_thread, interval, load, nesting_violations, raw, to_ns)


def test_modern_files_parse_with_top_level_keys_in_real_order(modern_run):
    for rank, trace in modern_run.traces.items():
        assert list(trace) == MODERN_KEYS
        assert trace["displayTimeUnit"] == "ms"
        assert len(trace["traceEvents"]) > 1000
        assert trace["distributedInfo"]["rank"] == rank


def test_every_trace_names_its_host_as_truth_does(any_run):
    hosts = {r: h["host"] for h in any_run.truth["hosts"] for r in h["ranks"]}
    assert sorted(set(hosts.values())) == ["node0", "node1"]
    for rank, trace in any_run.traces.items():
        assert trace["host_name"] == hosts[rank] == any_run.truth["ranks"][rank]["host"]


def test_modern_ts_and_dur_have_exactly_three_decimals(modern_run):
    text = raw(modern_run.path / "rank0.json.gz").decode()
    values = re.findall(r'"(?:ts|dur)":\s*([0-9.eE+-]+)', text)
    assert len(values) > 2000
    assert all(re.fullmatch(r"\d+\.\d{3}", v) for v in values)


def test_modern_base_time_is_the_kineto_trimonth_floor(modern_run):
    for trace in modern_run.traces.values():
        base = trace["baseTimeNanoseconds"]
        assert base % TRIMONTH_NS == 0
        first = min(to_ns(trace, e["ts"]) for e in trace["traceEvents"])
        assert 0 <= first - base < TRIMONTH_NS


def test_2022_has_integer_absolute_microseconds_and_no_base(old_run):
    for trace in old_run.traces.values():
        assert list(trace) == KEYS_2022
        assert trace["distributedInfo"] == {"backend": "nccl", "rank": trace["distributedInfo"]
                                            ["rank"], "world_size": 8}
        for e in trace["traceEvents"]:
            assert type(e["ts"]) is int and e["ts"] > 1_600_000_000_000_000
            if "dur" in e:
                assert type(e["dur"]) is int


def test_2022_dialect(old_run):
    trace = old_run.traces[0]
    ev = trace["traceEvents"]
    cats = Counter(e.get("cat") for e in ev)
    assert cats["async_cpu_to_gpu"] > 0 and "ac2g" not in cats and "fwdbwd" not in cats
    assert {e["name"] for e in ev if e.get("cat") == "async_cpu_to_gpu"} == {"async_gpu"}
    for e in ev:
        if e.get("name") == "record_param_comms":
            assert not COLL_ARGS & set(e["args"])
        if e.get("cat") in ("kernel", "cuda_runtime"):
            assert e["args"]["External id"] == e["args"]["correlation"]
        if e.get("cat") == "cpu_op":
            assert {"Trace name", "Profiler Event Index", "Call stack"} <= set(e["args"])
    nccl = {e["name"] for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")}
    assert nccl and all(n.startswith("ncclKernel_") and n.endswith("(ncclWorkElem)") for n in nccl)


def test_ids_are_unique_and_every_gpu_activity_links_to_its_launch(any_run):
    for trace in any_run.traces.values():
        ev = trace["traceEvents"]
        ext = [e["args"]["External id"] for e in ev if e.get("cat") in ("cpu_op", "user_annotation")]
        assert len(ext) == len(set(ext))
        runtime = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
        assert len(runtime) == sum(1 for e in ev if e.get("cat") == "cuda_runtime")
        flows = defaultdict(Counter)
        for e in ev:
            if e["ph"] in ("s", "f"):
                flows[(e["cat"], e["id"])][e["ph"]] += 1
        for e in ev:
            if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
                launch = runtime[e["args"]["correlation"]]
                assert e["args"]["External id"] == launch["args"]["External id"]
                assert to_ns(trace, e["ts"]) > to_ns(trace, launch["ts"])
                flow = flows[("ac2g" if "baseTimeNanoseconds" in trace else "async_cpu_to_gpu",
                              e["args"]["correlation"])]
                assert flow["s"] == 1 and flow["f"] >= 1


def test_modern_runtime_calls_nest_inside_the_op_with_their_external_id(modern_run):
    trace = modern_run.traces[1]
    ops = {e["args"]["External id"]: e for e in trace["traceEvents"]
           if e.get("cat") in ("cpu_op", "user_annotation")}
    for e in trace["traceEvents"]:
        if e.get("cat") == "cuda_runtime":
            op = ops[e["args"]["External id"]]
            assert op["tid"] == e["tid"]
            assert interval(trace, op)[0] <= interval(trace, e)[0]
            assert interval(trace, e)[1] <= interval(trace, op)[1]


def test_cpu_events_nest_strictly_and_streams_never_overlap(any_run):
    for trace in any_run.traces.values():
        for events in by_thread(trace).values():
            assert nesting_violations(trace, events) == 0
        for (pid, stream), events in by_thread(trace, ("kernel", "gpu_memcpy",
                                                       "gpu_memset")).items():
            spans = sorted(interval(trace, e) for e in events)
            assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), stream


def test_collective_calls_nest_c10d_record_param_comms_launch(any_run):
    modern = any_run.sc.fmt == "modern"
    for trace in any_run.traces.values():
        ev = trace["traceEvents"]
        kernels = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "kernel"}
        threads = {k: Timeline(trace, v) for k, v in by_thread(trace).items()}
        calls = [e for e in ev if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::")]
        assert calls
        for e in calls:
            thread = threads[(e["pid"], e["tid"])]
            rpc = [x for x in thread.inside(*interval(trace, e))
                   if x["name"] == "record_param_comms"]
            assert len(rpc) == 1
            launches = [x for x in thread.inside(*interval(trace, rpc[0]))
                        if x.get("cat") == "cuda_runtime" and x["args"]["correlation"] in kernels]
            assert len(launches) == 1
            kernel = kernels[launches[0]["args"]["correlation"]]
            assert kernel["name"].startswith("nccl") and kernel["tid"] in (20, 24, 28, 32)
            if modern:
                assert COLL_ARGS <= set(rpc[0]["args"])
                for key in ("Collective name", "In msg nelems", "Process Group Name", "Seq",
                            "Process Group Ranks", "dtype"):
                    assert kernel["args"][key] == rpc[0]["args"][key]


def test_modern_wait_records_have_the_real_shape(modern_run):
    waits = [e for e in modern_run.traces[0]["traceEvents"]
             if e.get("name") == "record_param_comms" and e["args"]["Collective name"] == "wait"]
    assert waits
    for w in waits:
        assert w["args"]["dtype"] == "Byte" and w["args"]["In msg nelems"] == 0
        assert "Seq" not in w["args"]


def test_modern_cuda_graph_kernels_share_the_launch_correlation(modern_run):
    trace = modern_run.traces[0]
    ev = trace["traceEvents"]
    graphs = [e for e in ev if e.get("name") == "cudaGraphLaunch"]
    assert len(graphs) == modern_run.sc.steps
    for g in graphs:
        corr = g["args"]["correlation"]
        nodes = [e for e in ev if e.get("cat") == "kernel" and e["args"]["correlation"] == corr]
        assert len(nodes) >= 2
        assert all(n["args"]["graph id"] != 0 for n in nodes)
        assert len({n["args"]["graph node id"] for n in nodes}) == len(nodes)
        assert all(n["args"]["External id"] == g["args"]["External id"] for n in nodes)


def test_metadata_rows_and_markers(any_run):
    trace = any_run.traces[5]
    ev = trace["traceEvents"]
    labels = {e["args"]["labels"] for e in ev if e.get("name") == "process_labels"}
    assert labels == {"CPU"} | {f"GPU {i}" for i in range(any_run.truth["ranks_per_host"])}
    streams = {e["args"]["name"] for e in ev if e.get("name") == "thread_name" and e["pid"] == 1}
    assert "stream 7 " in streams
    assert [e["pid"] for e in ev if e.get("cat") == "Trace"] == ["Spans"]
    assert ev[-1]["name"] == "Record Window End" and ev[-1]["pid"] == ""
    assert any(e["name"].startswith("Iteration Start") and e["pid"] == "Traces" for e in ev
               if e["ph"] == "i")
    gpu_pids = {e["pid"] for e in ev if e.get("cat") == "kernel"}
    assert gpu_pids == {any_run.truth["ranks"][5]["local_rank"]}


def test_modern_distributed_info_lists_the_ranks_groups(modern_run):
    info = modern_run.traces[6]["distributedInfo"]
    assert info["backend"] == "nccl" and info["world_size"] == 8 and "nccl_version" in info
    descs = [pg["pg_desc"] for pg in info["pg_config"]]
    assert descs == ["default_pg", "DATA_PARALLEL_GROUP", "TENSOR_MODEL_PARALLEL_GROUP",
                     "PIPELINE_MODEL_PARALLEL_GROUP"]
    assert info["pg_count"] == 4
    assert all(6 in pg["ranks"] and pg["backend_config"] == "cuda:nccl"
               for pg in info["pg_config"])


def test_device_properties_one_per_local_gpu(any_run):
    props = any_run.traces[0]["deviceProperties"]
    assert [p["id"] for p in props] == list(range(any_run.truth["ranks_per_host"]))
    assert {"name", "totalGlobalMem", "computeMajor", "numSms", "sharedMemPerBlockOptin"} <= set(
        props[0])


def test_pretty_output_has_one_key_per_line(tmp_path):
    sc = Scenario(tp=1, pp=1, dp=2, steps=1, layers=1, microbatches=1, seed=2)
    write_run(sc, tmp_path / "pretty", gzip=False, pretty=True)
    write_run(sc, tmp_path / "flat", gzip=False)
    text = (tmp_path / "pretty" / "rank0.json").read_text()
    assert all(line.count('": ') <= 1 for line in text.splitlines())
    pretty, flat = load(tmp_path / "pretty" / "rank0.json"), load(tmp_path / "flat" / "rank0.json")
    assert pretty == flat
    assert text.count("\n") > 5 * len(flat["traceEvents"])
    assert json.loads((tmp_path / "flat" / "truth.json").read_text())["ranks"][0]["file"] == \
        "rank0.json"
