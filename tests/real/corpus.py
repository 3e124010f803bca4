"""The corpus of real public traces (tests/data/real/corpus.json) as the tests see it.

The files are not in the repository: `python tests/data/real/fetch.py` (or `--mirror DIR` / `--from DIR`)
puts them under tests/data/real/cache/; a test whose trace is missing skips and says how to fetch it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "data" / "real"
CACHE = REAL / "cache"
DONE = ".verified"  # written by fetch.py once every file of a trace matched its sha256


def traces() -> list[dict]:
    return json.loads((REAL / "corpus.json").read_text())["traces"]


def by_id(trace_id: str) -> dict:
    return next(t for t in traces() if t["id"] == trace_id)


ALL = os.environ.get("BPROF_REAL_ALL") == "1"  # every corpus trace, not only the quick set


def trace_dir(trace: dict) -> Path:
    """The trace's folder (one file per rank); skips the test when it was not fetched, or when the
    trace is outside the quick set (corpus.json "quick") and BPROF_REAL_ALL=1 is not set."""
    if not trace.get("quick") and not ALL:
        pytest.skip(f"real trace {trace['id']} is outside the quick set: BPROF_REAL_ALL=1 runs every corpus trace")
    folder = CACHE / trace["id"]
    marker = folder / DONE
    if not marker.is_file() or marker.read_text().split() != [f["sha256"] for f in trace["files"]]:
        pytest.skip(f"real trace {trace['id']} not fetched: run `python tests/data/real/fetch.py --only {trace['id']}` "
                    f"(or add --mirror DIR / --from DIR where raw GitHub is out of reach)")
    return folder


def rank_files(trace: dict) -> list[Path]:
    return sorted(p for p in trace_dir(trace).iterdir() if p.name != DONE)


def ingest_args(trace: dict) -> list[str]:
    """`bprof ingest` arguments for the trace: its folder, and --rank where the trace records none."""
    args = [str(trace_dir(trace))]
    if trace.get("rank") is not None:
        args += ["--rank", str(trace["rank"])]
    return args
