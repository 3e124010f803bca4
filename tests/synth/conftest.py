"""Synthetic runs written once per test session (each takes about a second)."""

from __future__ import annotations

import pytest

from bprof.synth import Fault, Scenario, write_run
from tests.synth.read import load

MODERN = Scenario(tp=2, pp=2, dp=2, steps=2, first_step=5, layers=4, microbatches=3,
                  schedule="1f1b", hosts=2, fmt="modern", clock_offset_ns={0: 0, 1: 350_000},
                  clock_jitter_ns=2_000, seed=7,
                  faults=[Fault("slow_rank", rank=3, extra_ns=5_000_000)])
OLD = Scenario(tp=2, pp=2, dp=2, steps=2, first_step=1009, layers=2, microbatches=2,
               schedule="gpipe", hosts=2, fmt="2022", clock_offset_ns={1: -200_000},
               clock_jitter_ns=0, seed=3, dp_mode="zero1")
FP8 = Scenario(tp=2, pp=2, dp=2, steps=2, first_step=20, layers=2, microbatches=2, hosts=2,
               fmt="modern", device="H100", dtype="fp8", clock_offset_ns={1: -80_000},
               clock_jitter_ns=1_000, seed=13)


class Run:
    def __init__(self, sc, path, truth):
        self.sc, self.path, self.truth = sc, path, truth
        self.traces = {r["rank"]: load(path / r["file"]) for r in truth["ranks"]}


@pytest.fixture(scope="session")
def modern_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("modern")
    return Run(MODERN, path, write_run(MODERN, path))


@pytest.fixture(scope="session")
def old_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("f2022")
    return Run(OLD, path, write_run(OLD, path))


@pytest.fixture(scope="session")
def fp8_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp8")
    return Run(FP8, path, write_run(FP8, path))


@pytest.fixture(scope="session", params=["modern", "2022"])
def any_run(request, modern_run, old_run):
    return modern_run if request.param == "modern" else old_run
