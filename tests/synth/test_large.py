"""write_large_trace: valid JSON of about the requested size, with ids and steps that advance."""

from __future__ import annotations

import re

import pytest

from bprof.synth import write_large_trace
from tests.synth.read import KEYS_2022, MODERN_KEYS, interval, load, raw


@pytest.mark.parametrize("fmt", ["modern", "2022"])
def test_large_trace_is_valid_and_about_the_target_size(tmp_path, fmt):
    path = tmp_path / "big.json"
    target = 3_000_000
    info = write_large_trace(path, target, fmt=fmt, seed=1)
    size = path.stat().st_size
    assert info["json_bytes"] == size
    assert 0.7 * target < size < 1.3 * target
    trace = load(path)
    assert list(trace) == (MODERN_KEYS if fmt == "modern" else KEYS_2022)
    ev = trace["traceEvents"]
    assert info["events"] == len(ev) and info["steps"] > 3
    steps = [int(e["name"].split("#")[1]) for e in ev if e.get("name", "").startswith("ProfilerStep")]
    assert steps == list(range(steps[0], steps[0] + info["steps"]))
    ext = [e["args"]["External id"] for e in ev if e.get("cat") in ("cpu_op", "user_annotation")]
    assert len(ext) == len(set(ext))
    corr = [e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime"]
    assert len(corr) == len(set(corr))
    span = next(interval(trace, e) for e in ev if e.get("cat") == "Trace")
    for e in ev:
        if e["ph"] == "X" and e.get("cat") != "Trace":
            s, t = interval(trace, e)
            assert span[0] <= s and t <= span[1]
    starts = [interval(trace, e)[0] for e in ev if e.get("name", "").startswith("ProfilerStep")]
    assert starts == sorted(starts)
    if fmt == "modern":
        values = re.findall(r'"(?:ts|dur)":([0-9.]+)', raw(path).decode())
        assert all(re.fullmatch(r"\d+\.\d{3}", v) for v in values)
        seqs = [e["args"]["Seq"] for e in ev if e.get("name") == "record_param_comms"
                and e["args"]["Collective name"] == "allreduce"
                and e["args"]["Process Group Description"] == "DATA_PARALLEL_GROUP"]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))


def test_large_trace_can_be_gzipped(tmp_path):
    path = tmp_path / "big.json.gz"
    info = write_large_trace(path, 1_500_000)
    assert len(raw(path)) == info["json_bytes"]
    assert load(path)["traceEvents"]
