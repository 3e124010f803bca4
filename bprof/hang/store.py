"""Hang verdicts in the store: the `hangs` table, and the run row a verdict attaches to.

A hung job often has no captured step window. A verdict attaches to the run of the same
`bprof record` when one was ingested (the run whose traces carry the record's run id,
meta/launch.json; of several windows the latest), to the run given explicitly, else to a run row
of the hang alone: no ranks ingested, its fingerprint taken over the dump files (storing the same
dumps again finds it again and replaces its verdict).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from bprof.errors import DataError
from bprof.hang.dumps import JobDumps
from bprof.hang.verdict import Verdict


def record_run(con: duckdb.DuckDBPyConnection, paths: list[Path]) -> int | None:
    """The ingested run of the `bprof record` run directory among `paths` (its latest window), if any."""
    for path in paths:
        launch = Path(path) / "meta" / "launch.json"
        if not launch.is_file():
            continue
        try:
            record_id = json.loads(launch.read_text()).get("run_id")
        except (OSError, ValueError) as exc:
            raise DataError(f"{launch}: unreadable ({exc})") from None
        row = con.execute("""
            SELECT r.run_id FROM runs r LEFT JOIN steps s USING (run_id)
            WHERE json_extract_string(r.metadata, '$.bprof.run_id') = ? AND r.num_ranks_ingested > 0
            GROUP BY r.run_id ORDER BY max(s.step) DESC NULLS LAST, r.run_id DESC LIMIT 1""", [record_id]).fetchone()
        if row:
            return row[0]
    return None


def fingerprint(job: JobDumps, paths: list[Path]) -> str:
    """sha256 over the sorted "rank:sha256" of each dump file (dumps carry no rank of their own: the
    file name gives it) and the sha256 of what `bprof record` wrote beside them (hang/ranks.json)."""
    parts = [f"{r}:{_sha256(d.path)}" for r, d in job.dumps.items() if d.path is not None and Path(d.path).is_file()]
    for path in paths:
        for cand in (Path(path) / "hang" / "ranks.json", Path(path) / "ranks.json"):
            if cand.is_file():
                parts.append(f"ranks.json:{_sha256(cand)}")
    return hashlib.sha256("".join(sorted(parts)).encode()).hexdigest()


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None


def save_hang(con: duckdb.DuckDBPyConnection, verdict: Verdict, job: JobDumps, paths: list[Path],
              run_id: int | None) -> tuple[int, int]:
    """Write the verdict into `hangs` (and the hang's own run row when run_id is None), in one
    transaction; returns (run_id, hang_id). The same dumps stored again for the same run replace
    their row."""
    fp = fingerprint(job, paths)
    source = ";".join(str(Path(p).resolve()) for p in paths)
    con.execute("BEGIN TRANSACTION")
    try:
        if run_id is None:
            run_id = _hang_run(con, job, paths, fp, source)
        con.execute("DELETE FROM hangs WHERE run_id = ? AND fingerprint = ?", [run_id, fp])
        out = verdict.to_json()
        culprits = [{**c, "last_collective": vc.last_collective, "groups": vc.groups, "late_before": vc.late_before}
                    for c, vc in zip(out["culprits"], verdict.culprits)]
        hang_id = con.execute("""
            INSERT INTO hangs (run_id, analysed_at, source_path, fingerprint, verdict, world_size, num_dumps,
                               num_stuck_groups, culprit_ranks, culprits, dead_ranks, late_ranks, notes, detail)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING hang_id""",
            [run_id, datetime.now(timezone.utc), source, fp, verdict.verdict, job.world_size,
             sum(1 for d in job.dumps.values() if d.ok), sum(1 for g in verdict.groups if g.stuck),
             [c.rank for c in verdict.culprits], json.dumps(culprits), sorted(job.dead),
             verdict.before["late_ranks"] if verdict.before and verdict.before["analysed"] else None,
             verdict.notes, json.dumps(out)]).fetchone()[0]
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return run_id, hang_id


def _hang_run(con, job: JobDumps, paths: list[Path], fp: str, source: str) -> int:
    """The run row of a hang with no ingested window (found again by its fingerprint)."""
    key = "hang:" + fp
    row = con.execute("SELECT run_id FROM runs WHERE fingerprint = ?", [key]).fetchone()
    if row:
        return row[0]
    launch = _launch(paths)
    base = "hang-" + (launch.get("name") or Path(paths[0]).resolve().name)
    taken = {r[0] for r in con.execute("SELECT name FROM runs WHERE name = ? OR name LIKE ?",
                                       [base, base + "-%"]).fetchall()}
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    command = launch.get("command")
    started_ns = launch.get("started_ns")
    return con.execute("""
        INSERT INTO runs (name, started_at, ingested_at, source_path, fingerprint, command, world_size,
                          num_ranks_ingested, missing_ranks, consistent, metadata)
        VALUES (?, CASE WHEN ?::BIGINT IS NULL THEN NULL ELSE make_timestamptz(?::BIGINT // 1000) END, ?, ?, ?, ?, ?,
                0, ?, true, ?) RETURNING run_id""",
        [name, started_ns, started_ns, datetime.now(timezone.utc), source, key,
         " ".join(command) if isinstance(command, list) else command, job.world_size or None,
         list(range(job.world_size)) if job.world_size else None,
         json.dumps({"bprof": {"run_id": launch.get("run_id"), "hang_only": True}})]).fetchone()[0]


def _launch(paths: list[Path]) -> dict:
    for path in paths:
        launch = Path(path) / "meta" / "launch.json"
        if launch.is_file():
            try:
                return json.loads(launch.read_text())
            except (OSError, ValueError) as exc:
                raise DataError(f"{launch}: unreadable ({exc})") from None
    return {}

