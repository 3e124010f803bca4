"""Stored per-run summaries measured from real recordings (tests/ci/data/*.json say where each came
from), loaded as bprof.ci RunSummary values, and a store of inline analysed runs for CLI tests."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from bprof.ci.history import Entry
from bprof.ci.summary import RunSummary

DATA = Path(__file__).resolve().parent / "data"


def load(name: str) -> dict[str, RunSummary]:
    """{run name: summary} of data/<name>.json."""
    doc = json.loads((DATA / f"{name}.json").read_text())
    return {r["run_name"]: RunSummary.from_dict(r) for r in doc["runs"]}


def series(summaries: list[RunSummary], name: str = "main") -> list[Entry]:
    return [Entry(i + 1, name, s) for i, s in enumerate(summaries)]


def with_facts(summary: RunSummary, **facts) -> RunSummary:
    return replace(summary, facts={**summary.facts, **facts})


def insert_run(con, name: str, step_ns: list[list[int]], *, benchmark: str = "bench", torch_version: str = "2.13.0",
               world_size: int = 2, fingerprint: str | None = None) -> int:
    """An analysed run as bprof analyze leaves it, reduced to what bprof ci reads: the runs row,
    step_metrics step_time_ns per rank and step (step_ns[step][rank]) and the metrics peak."""
    metadata = {"bprof_model": {"model_flops_per_step": 1e9, "tp": 1, "pp": 1, "dp": world_size},
                "environment": {"torch_version": torch_version}}
    run_id = con.execute("""
        INSERT INTO runs (name, ingested_at, source_path, fingerprint, benchmark, git_branch, git_sha, world_size,
                          num_ranks_ingested, backend, device_name, model_flops_per_step, consistent, metadata)
        VALUES (?, now(), 'inline', ?, ?, 'main', 'abc123', ?, ?, 'gloo', 'cpu', 1e9, true, ?) RETURNING run_id""",
        [name, fingerprint or name, benchmark, world_size, world_size, json.dumps(metadata)]).fetchone()[0]
    for step, per_rank in enumerate(step_ns):
        for rank, ns in enumerate(per_rank):
            con.execute("INSERT INTO step_metrics VALUES (?, ?, ?, 'step_time_ns', ?, 'ns')", [run_id, rank, step, ns])
    con.execute("INSERT INTO metrics VALUES (?, 'peak_flops_per_s_per_device', 1e10, 'flops_per_s', 'metrics')", [run_id])
    return run_id
