"""Issue 21 item 5 (MI300X: CPU steps of 16.8/16.0/15.9 ms launch 56.5 ms of device work that ends
38 ms after the CPU): ingest measures each step on the device (steps.device_*) from the device work
the step launched, and its lag behind the CPU range. Expectations come from what the trace writer
wrote, and for the real traces from a stdlib reader of the raw JSON; CPU-only runs get no device step.
"""

from __future__ import annotations

import gzip
import json

import pytest

from bprof.store.ingest import IngestOptions, ingest_paths
from tests.conftest import shared_trace
from tests.store.device_lag_trace import write_device_lag_trace
from tests.store.tiny_traces import modern_trace


def expected_device_steps(cpu_steps, kernels, launches):
    """step -> (device_ts_ns, device_dur_ns, device_lag_ns) by the definition in schema.sql, from
    the CPU ranges (step, ts_ns, dur_ns), the device work (launching step, ts_ns, dur_ns) and the
    launch times of each step's device work (step -> ts_ns)."""
    out, prev_end = {}, {}
    ends = {}
    for step, _, _ in sorted(cpu_steps):
        mine = [(ts, ts + dur) for s, ts, dur in kernels if s == step]
        if not mine:
            continue
        ends[step] = max([e for _, e in mine] + [ends[s] for s in ends])
        prev_end[step] = ends.get(step - 1)
        cpu_ts, cpu_end = next((ts, ts + dur) for s, ts, dur in cpu_steps if s == step)
        if prev_end[step] is not None:
            start = prev_end[step]
        else:  # the first step: the device's last busy end before its first work, not before the CPU
            # range; with nothing recorded before, its first work
            first = min(ts for ts, _ in mine)
            before = [ts + dur for _, ts, dur in kernels if ts < first]
            if before:
                start = min(first, max([cpu_ts] + before))
            else:  # nothing recorded before: free at the first launch if the work started before the second
                second = sorted(launches.get(step, []))[1:2]
                start = cpu_ts if not second or first <= second[0] else first
        out[step] = (start, ends[step] - start, ends[step] - cpu_end)
    return out


def _steps(store, run_id):
    return {s: (ts, dur, lag) for s, ts, dur, lag in store.execute(
        "SELECT step, device_ts_ns, device_dur_ns, device_lag_ns FROM steps WHERE run_id = ? ORDER BY step",
        [run_id]).fetchall()}


def test_mi300x_device_lag_steps_are_the_device_work_each_step_launched(store, tmp_path):
    written = write_device_lag_trace(tmp_path / "run" / "rank0.json.gz")
    [result] = ingest_paths(store, [tmp_path / "run"])
    got = _steps(store, result.run_id)
    want = expected_device_steps(written.cpu_steps, written.kernels, written.launches)
    assert sorted(got) == [1, 2, 3]
    for step, (ts, dur, lag) in want.items():
        assert got[step] == pytest.approx((ts, dur, lag), abs=2)  # ns rounding of float us
    # the numbers, from what was written: 56.5 ms of device work in all, back to back
    work_ns = sum(dur for s, _, dur in written.kernels if s is not None)
    assert sum(d for _, d, _ in got.values()) == pytest.approx(work_ns, abs=10)
    last_cpu_end = max(ts + dur for _, ts, dur in written.cpu_steps)
    assert got[3][2] == pytest.approx(max(ts + dur for _, ts, dur in written.kernels) - last_cpu_end, abs=2)
    # the device lag grows: the host ran ahead
    assert got[1][2] < got[2][2] < got[3][2]
    # device steps tile the device timeline
    assert got[1][0] + got[1][1] == got[2][0] and got[2][0] + got[2][1] == got[3][0]
    # the CPU ranges stay what they were
    cpu = store.execute("SELECT step, ts_ns, dur_ns FROM steps WHERE run_id = ? ORDER BY step", [result.run_id]).fetchall()
    assert [(s, pytest.approx(ts, abs=2), pytest.approx(d, abs=2)) for s, ts, d in cpu] == written.cpu_steps


def test_a_starved_device_step_starts_where_the_previous_one_ended(store, tmp_path):
    written = write_device_lag_trace(tmp_path / "run" / "rank0.json.gz", device_steps_ms=(4.0, 4.0, 4.0),
                                     pre_window=False)
    [result] = ingest_paths(store, [tmp_path / "run"])
    got = _steps(store, result.run_id)
    want = expected_device_steps(written.cpu_steps, written.kernels, written.launches)
    for step, (ts, dur, lag) in want.items():
        assert got[step] == pytest.approx((ts, dur, lag), abs=2)
    # the idle wait for a step's launches is that step's: steps 2 and 3 hold more than their 4 ms of work
    work = {s: sum(d for k, _, d in written.kernels if k == s) for s in (1, 2, 3)}
    assert got[2][1] > work[2] and got[3][1] > work[3]


def test_cpu_only_runs_have_no_device_step(store, tmp_path):
    for rank in (0, 1):
        with gzip.open(tmp_path / f"rank{rank}.json.gz", "wt") as f:
            json.dump(modern_trace(rank), f)
    [result] = ingest_paths(store, [tmp_path])
    rows = store.execute("SELECT count(*), count(device_ts_ns), count(device_dur_ns), count(device_lag_ns) FROM steps "
                         "WHERE run_id = ?", [result.run_id]).fetchone()
    assert rows == (4, 0, 0, 0)


def _raw_device_steps(path):
    """The same definition over the raw JSON: a device op's step is its launch's step (runtime or
    driver call with the same correlation inside a ProfilerStep range), else the step holding its start."""
    with gzip.open(path, "rt") as f:
        trace = json.load(f)
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    base = trace.get("baseTimeNanoseconds", 0)

    def ns(us):
        return base + round(us * 1000)
    ranges = {}
    for e in events:
        if e.get("cat") in ("user_annotation", "cpu_op", "Operator") and str(e.get("name", "")).startswith("ProfilerStep#"):
            step = int(e["name"][13:])
            lo, hi = ranges.get(step, (ns(e["ts"]), ns(e["ts"]) + round(e["dur"] * 1000)))
            ranges[step] = (min(lo, ns(e["ts"])), max(hi, ns(e["ts"]) + round(e["dur"] * 1000)))

    def step_at(t):
        return next((s for s, (lo, hi) in sorted(ranges.items()) if lo <= t < hi), None)
    launch_step = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime") and "correlation" in (e.get("args") or {}):
            s = step_at(ns(e["ts"]))
            if s is not None:
                c = e["args"]["correlation"]
                launch_step[c] = min(s, launch_step.get(c, s))
    device, device_corr = [], set()
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"):
            c = (e.get("args") or {}).get("correlation")
            s = launch_step.get(c) if c in launch_step else step_at(ns(e["ts"]))
            device.append((s, ns(e["ts"]), round(e["dur"] * 1000)))
            device_corr.add(c)
    launches = {}
    for e in events:
        c = (e.get("args") or {}).get("correlation")
        if e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime") and c in device_corr and step_at(ns(e["ts"])) is not None:
            launches.setdefault(step_at(ns(e["ts"])), []).append(ns(e["ts"]))
    cpu = [(s, lo, hi - lo) for s, (lo, hi) in ranges.items()]
    # absolute epoch us as floats (no baseTimeNanoseconds) carry ~0.25 us of float error per timestamp
    return expected_device_steps(cpu, device, launches), 2 if "baseTimeNanoseconds" in trace else 1000


@pytest.mark.parametrize("folder", ["a100_ddp_nccl_rank0", "a100_ws16_rank0", "mi250_rocm_minitoy",
                                    "v100_ns_resolution_rank0", "v100_resnet50_legacy_2021", "cpu_gloo_rank34"])
def test_real_traces_device_steps_match_the_raw_json(store, folder):
    path = shared_trace(folder)
    [result] = ingest_paths(store, [path], IngestOptions(rank=0 if folder in ("mi250_rocm_minitoy",
                                                                             "v100_resnet50_legacy_2021") else None))
    got = {s: v for s, v in _steps(store, result.run_id).items() if v[0] is not None}
    want, tol = _raw_device_steps(next(path.iterdir()))
    assert sorted(got) == sorted(want)
    if folder == "cpu_gloo_rank34":
        assert got == {}  # no device: the training thread stands in for it
        return
    assert got
    for step, v in want.items():
        assert got[step] == pytest.approx(v, abs=tol)
        assert got[step][1] > 0
