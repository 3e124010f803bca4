"""bprof.annotate: its profiler range (what bprof's analysis reads from the Kineto trace) and its
NVTX range, through the `nvtx` package where it is installed, else torch.cuda.nvtx where CUDA is
available, else nowhere.

The nvtx package runs without CUDA: with no tool attached (Nsight Systems attaches one through
NVTX_INJECTION64_PATH) its calls return at once. What these tests can observe without Nsight is
that bprof calls the real package's push/pop with the bprof domain and the range's colour, and that
those calls succeed here; the package's absence is simulated in a fresh interpreter by a None entry
in sys.modules, which makes `import nvtx` raise ImportError as if it were not installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bprof.profiler import nvtx_ranges

REPO = Path(__file__).resolve().parents[2]

# Prints what bprof.annotate sent where: the backend, the torch.cuda.nvtx calls it made, and the
# Kineto trace's user_annotation ranges, for bprof.annotate and for plain record_function.
PROBE = """
import json, sys
if sys.argv[1] == "block-nvtx":
    sys.modules["nvtx"] = None
import torch
import bprof
from bprof.profiler import nvtx_ranges

cuda_calls = []
if torch.cuda.is_available():
    real_push, real_pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    torch.cuda.nvtx.range_push = lambda msg: (cuda_calls.append(("push", msg)), real_push(msg))[1]
    torch.cuda.nvtx.range_pop = lambda: (cuda_calls.append(("pop",)), real_pop())[1]

def ranges(enter, path):
    @enter("fwd/layer")
    def layer(x):
        return x @ x
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with enter("step"):
            x = torch.randn(8, 8)
            with enter("fwd/embed"):
                x = x + 1
            layer(x)
            layer(x)
    prof.export_chrome_trace(path)
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = sorted((e["ts"], -e["dur"], e["name"]) for e in events if e.get("cat") == "user_annotation")
    return [name for *_, name in spans]

print(json.dumps({"backend": nvtx_ranges.backend(), "cuda_calls": cuda_calls,
                  "annotate": ranges(bprof.annotate, sys.argv[2] + "/a.json"),
                  "record_function": ranges(torch.profiler.record_function, sys.argv[2] + "/r.json")}))
"""

EXPECTED_RANGES = ["step", "fwd/embed", "fwd/layer", "fwd/layer"]   # in start order


def probe(mode: str, tmp_path: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_nvtx_package_gets_each_range_in_the_bprof_domain_with_its_kinds_colour(monkeypatch):
    nvtx = pytest.importorskip("nvtx", reason="the nvtx package is part of bprof[capture]")
    assert nvtx_ranges.backend() == "nvtx"
    calls = []
    real_push, real_pop = nvtx.push_range, nvtx.pop_range

    def push_range(message=None, color="blue", domain=None, **kw):
        calls.append(("push", message, color, domain))
        return real_push(message, color=color, domain=domain, **kw)   # the real call: it must succeed here

    def pop_range(domain=None):
        calls.append(("pop", domain))
        return real_pop(domain=domain)

    monkeypatch.setattr(nvtx, "push_range", push_range)
    monkeypatch.setattr(nvtx, "pop_range", pop_range)
    import bprof

    @bprof.annotate("fwd/layer")
    def layer():
        return 1

    with bprof.annotate("step"):
        with bprof.annotate("fwd/embed"):
            pass
        layer()
    embed, step = nvtx_ranges.color_argb("fwd/embed"), nvtx_ranges.color_argb("step")
    assert calls == [("push", "step", step, "bprof"), ("push", "fwd/embed", embed, "bprof"), ("pop", "bprof"),
                     ("push", "fwd/layer", embed, "bprof"), ("pop", "bprof"), ("pop", "bprof")]
    assert embed in nvtx_ranges.PALETTE_ARGB and step in nvtx_ranges.PALETTE_ARGB


def test_one_colour_per_kind_the_same_in_every_process():
    assert nvtx_ranges.kind_of("fwd/attn/qkv") == "fwd" and nvtx_ranges.kind_of("optimizer") == "optimizer"
    assert nvtx_ranges.color_argb("fwd/attn") == nvtx_ranges.color_argb("fwd/mlp")
    kinds = ["fwd", "bwd", "optimizer", "data", "step", "comm", "eval", "ckpt"]
    assert len({nvtx_ranges.color_argb(k) for k in kinds}) > 1
    # crc32, not hash(): the colour of a kind does not depend on PYTHONHASHSEED
    code = "from bprof.profiler import nvtx_ranges; print(nvtx_ranges.color_argb('fwd'))"
    seen = {subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(REPO)}).stdout.strip()
            for seed in ("1", "2")}
    assert seen == {str(nvtx_ranges.color_argb("fwd"))}


def test_without_the_package_torch_cuda_nvtx_where_cuda_is_available_else_no_nvtx(tmp_path):
    got = probe("block-nvtx", tmp_path)
    if torch.cuda.is_available():
        assert got["backend"] == "torch.cuda.nvtx"
        assert got["cuda_calls"] == [["push", "step"], ["push", "fwd/embed"], ["pop"],
                                     ["push", "fwd/layer"], ["pop"], ["push", "fwd/layer"], ["pop"], ["pop"]]
    else:
        assert got["backend"] is None and got["cuda_calls"] == []
    assert got["annotate"] == got["record_function"] == EXPECTED_RANGES


def test_the_kineto_ranges_are_those_of_record_function_with_the_package(tmp_path):
    pytest.importorskip("nvtx", reason="the nvtx package is part of bprof[capture]")
    got = probe("with-nvtx", tmp_path)
    assert got["backend"] == "nvtx" and got["cuda_calls"] == []   # the package, not torch's binding
    assert got["annotate"] == got["record_function"] == EXPECTED_RANGES
