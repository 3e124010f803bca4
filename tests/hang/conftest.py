from __future__ import annotations

import pytest

from tests.hang.jobs import run_faulted

_jobs: dict = {}


@pytest.fixture(scope="session")
def faulted_job(tmp_path_factory):
    """fault name (+ dump format) -> (folder of the job's dumps, torchrun's CompletedProcess); each job runs once."""

    def get(fault: str, dump_format: str = "pickle"):
        key = (fault, dump_format)
        if key not in _jobs:
            out = tmp_path_factory.mktemp(f"{fault}_{dump_format}")
            _jobs[key] = (out, run_faulted(fault, out, dump_format=dump_format))
        return _jobs[key]

    return get
