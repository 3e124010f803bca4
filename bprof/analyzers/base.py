"""What every analyzer shares: its options, its findings, its result, and how it writes them.

An analyzer is `analyzers/<name>.sql` beside `analyzers/<name>.py` with one entry point,
`analyze(con, run_id, options) -> Result`. Its SQL creates only `<name>_*` tables, each with a
`run_id` column; re-running replaces that run's rows (`replace_rows`), so analysis is idempotent.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import duckdb

from bprof.store.sqlfile import run_sql_file

SEVERITIES = ("critical", "warning", "info", "not_measurable")


@dataclasses.dataclass(frozen=True)
class Options:
    """Knobs of one `bprof analyze` run; every analyzer gets the same object."""

    peak_flops_per_s: float | None = None  # dense peak per device, overrides the tables (--peak-flops)
    nic_bytes_per_s: float | None = None  # inter-host link peak per GPU and direction (--nic-gbps)
    hta_compat: bool = False  # also compute HTA 0.5's whole-trace breakdown (parity checks only)
    tokens_per_step: int | None = None  # overrides the run's declared tokens per optimizer step
    top_n: int = 20  # rows kept in "top" tables (kernels, ops)


@dataclasses.dataclass
class Finding:
    """One cause of lost time. `lost_ns` is how much shorter the step would be without it, per step
    on the rank(s) named in the evidence; `detail` states the counterfactual behind that number."""

    severity: str
    title: str
    advice: str
    detail: str
    lost_ns: int | None
    evidence: dict[str, Any]

    def __post_init__(self):
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")


@dataclasses.dataclass
class Result:
    analyzer: str
    tables: list[str]
    findings: list[Finding] = dataclasses.field(default_factory=list)


def run_sql(con: duckdb.DuckDBPyConnection, filename: str, run_id: int, params: dict | None = None) -> None:
    """Run analyzers/<filename> with $run_id (and `params`) bound."""
    run_sql_file(con, "bprof.analyzers", filename, {"run_id": run_id, **(params or {})})


def table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether the store has the (non-temporary) table `name`: derived tables exist once analysed."""
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ? AND NOT temporary",
                            [name]).fetchone()[0])


def replace_rows(con: duckdb.DuckDBPyConnection, tables: list[str], run_id: int) -> None:
    """Delete a run's rows from derived tables before an analyzer writes them again."""
    for table in tables:
        if table_exists(con, table):
            # table names come from the analyzers' own constants, never from user input
            con.execute(f"DELETE FROM {table} WHERE run_id = ?", [run_id])


def write_findings(con: duckdb.DuckDBPyConnection, run_id: int, analyzer: str, findings: list[Finding]) -> None:
    """Replace the analyzer's findings for the run."""
    con.execute("DELETE FROM findings WHERE run_id = ? AND analyzer = ?", [run_id, analyzer])
    for f in findings:
        detail = f"{f.advice}\n{f.detail}" if f.detail else f.advice
        con.execute(
            "INSERT INTO findings (run_id, analyzer, severity, lost_ns, title, detail, evidence) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [run_id, analyzer, f.severity, None if f.lost_ns is None else int(f.lost_ns), f.title, detail,
             json.dumps({"advice": f.advice, **f.evidence})],
        )


def not_measurable(title: str, why: str, fix: str, **evidence) -> Finding:
    """The explicit finding for missing data: never a zero that looks like a result."""
    return Finding("not_measurable", title, fix, why, None, evidence)


def severity_for(lost_ns: int, step_ns: float) -> str:
    """critical at ≥ 10% of the step, warning at ≥ 2%, else info."""
    share = lost_ns / step_ns if step_ns else 0.0
    return "critical" if share >= 0.10 else "warning" if share >= 0.02 else "info"


def write_metrics(con: duckdb.DuckDBPyConnection, run_id: int, analyzer: str,
                  metrics: dict[str, tuple[float | None, str]]) -> None:
    """Upsert run-level metrics: name -> (value or None when not measurable, unit)."""
    for name, (value, unit) in metrics.items():
        con.execute("DELETE FROM metrics WHERE run_id = ? AND name = ?", [run_id, name])
        con.execute("INSERT INTO metrics VALUES (?, ?, ?, ?, ?)", [run_id, name, value, unit, analyzer])
