"""Ingest the watch series of `bprof record --watch` (the files bprof.watch.files describes).

The series spans the whole recording, while each captured trace window is a run of its own: a
recording is a `watch_recordings` row keyed by its run directory (its fingerprint: the watch files'
sha256s), and each window run it produced is linked to it in `watch_windows`. A watched job that
opened no window is a recording with no run, so no trace-less run reaches the analyzers or CI.

Every watch file is read into temporary tables before any run of the directory is stored
(`stage`): a damaged file stops the ingest with its name and the store unchanged. `store` then
writes one recording in one transaction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from bprof.errors import DataError
from bprof.store.reduce import file_sha256
from bprof.watch import files

STEP_COLUMNS = ("iteration", "start_ns", "end_ns", "step_ns", "busy_ns", "data_wait_ns", "data_idle_ns", "gc_ns",
                "blocked_ns", "windowed")
GROUP_COLUMNS = ("iteration", "pg_name", "pg_desc", "blocked_ns", "calls")


@dataclass
class WatchResult:
    recording_id: int
    name: str
    created: bool  # False when the same watch files were ingested before
    path: str
    num_ranks: int = 0
    num_rows: int = 0
    num_iterations: int = 0
    num_triggers: int = 0
    window_runs: list[int] = field(default_factory=list)  # runs.run_id of its windows, in window order

    def summary(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Staged:
    """One recording read and checked, waiting in temporary tables for `store`."""

    path: Path
    index: int  # suffix of its temporary tables
    fingerprint: str
    live: dict
    launch: dict
    num_step_files: int
    num_group_files: int


def is_watched(path: Path) -> bool:
    """A run directory with watch step files (bprof record --watch)."""
    return Path(path).is_dir() and any(files.step_files(f.path) for f in files.rank_folders(Path(path)))


def stage(con: duckdb.DuckDBPyConnection, path: Path, index: int = 0) -> Staged:
    """Read every watch file of the run directory `path` into temporary tables _watch_steps_<index>
    and _watch_groups_<index>; a file that cannot be read is a DataError naming it."""
    path = Path(path).resolve()
    steps, groups = [], []
    for folder in files.rank_folders(path):
        steps += [(p, folder.rank, folder.attempt) for p in files.step_files(folder.path)]
        groups += [(p, folder.rank, folder.attempt) for p in sorted(folder.path.glob("*.groups.parquet"))]
    if not steps:
        raise DataError(f"{path / 'watch'}: no watch step files (*.steps.parquet)")
    live_path = path / "watch" / files.LIVE_FILE
    live = _read_json(live_path, "live analysis file") if live_path.exists() else {}
    launch_path = path / "meta" / "launch.json"
    launch = _read_json(launch_path, "bprof record launch file") if launch_path.exists() else {}
    parts = [f"{p.relative_to(path).as_posix()}:{file_sha256(p)}" for p, _, _ in steps + groups]
    if live_path.exists():
        parts.append(f"watch/{files.LIVE_FILE}:{file_sha256(live_path)}")
    fingerprint = hashlib.sha256("".join(sorted(parts)).encode()).hexdigest()
    _load(con, f"_watch_steps_{index}", steps, STEP_COLUMNS, with_host=True)
    _load(con, f"_watch_groups_{index}", groups, GROUP_COLUMNS, with_host=False)
    _check_live(live, live_path)
    return Staged(path, index, fingerprint, live, launch, len(steps), len(groups))


def _load(con, table: str, found: list[tuple[Path, int, int]], columns: tuple[str, ...], with_host: bool) -> None:
    """Files -> the temp table `table` (name made by stage, never from input), with rank and attempt
    from their folder and, for step files, the host their metadata names."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table}_files (path VARCHAR, rank INTEGER, attempt INTEGER)")
    if not found:
        types = {"pg_name": "VARCHAR", "pg_desc": "VARCHAR", "windowed": "BOOLEAN"}
        con.execute(f"CREATE OR REPLACE TEMP TABLE {table} (rank INTEGER, attempt INTEGER, "
                    + ", ".join(f"{c} {types.get(c, 'BIGINT')}" for c in columns) + ")")
        return
    con.execute(f"INSERT INTO {table}_files SELECT unnest($1), unnest($2), unnest($3)",
                [[str(p) for p, _, _ in found], [r for _, r, _ in found], [a for _, _, a in found]])
    paths = [str(p) for p, _, _ in found]
    try:
        con.execute(f"""CREATE OR REPLACE TEMP TABLE {table} AS
            SELECT f.rank, f.attempt, {", ".join(f"w.{c}" for c in columns)}
            FROM read_parquet($paths, filename = true) w JOIN {table}_files f ON f.path = w.filename""",
                    {"paths": paths})
        if with_host:
            con.execute(f"""CREATE OR REPLACE TEMP TABLE {table}_hosts AS
                SELECT f.rank, f.attempt, any_value(json_extract_string(decode(m.value), '$.host')) AS host
                FROM parquet_kv_metadata($paths) m JOIN {table}_files f ON f.path = m.file_name
                WHERE decode(m.key) = 'bprof_watch' GROUP BY ALL""", {"paths": paths})
    except duckdb.Error as exc:
        raise _bad_file(con, paths, columns, exc) from None


def _bad_file(con, paths: list[str], columns: tuple[str, ...], exc: duckdb.Error) -> DataError:
    """The first of `paths` that cannot be read on its own, or lacks a column, named with why."""
    for path in paths:
        try:
            names = [r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [path]).fetchall()]
            con.execute("SELECT count(*) FROM read_parquet(?)", [path]).fetchone()
        except duckdb.Error as one:
            return DataError(f"{path}: unreadable watch file ({_first_line(one)})")
        missing = [c for c in columns if c not in names]
        if missing:
            return DataError(f"{path}: not a bprof watch file (no column {', '.join(missing)})")
    return DataError(f"{paths[0]} and {len(paths) - 1} more: watch files could not be read together ({_first_line(exc)})")


def _check_live(live: dict, path: Path) -> None:
    """live.json's lists have the fields store() reads."""
    needed = {"triggers": ("seen_at", "start", "steps", "rule", "rank", "reason", "time_ns"),
              "episodes": ("rule", "rank", "first_iteration", "last_iteration", "worst_score", "triggered"),
              "scores": ("rank", "iteration", "own_ns", "peers_own_ns", "excess_ns", "score")}
    for key, names in needed.items():
        entries = live.get(key) or []
        if not isinstance(entries, list) or any(not isinstance(e, dict) or any(n not in e for n in names)
                                                for e in entries):
            raise DataError(f"{path}: {key} is not a list of entries with {', '.join(names)}")


def store(con: duckdb.DuckDBPyConnection, staged: Staged, run_ids: list[int]) -> WatchResult:
    """Write a staged recording (unless its files were ingested before) and link the window runs
    among `run_ids`, and those of the same bprof record, to it; one transaction."""
    existing = con.execute("SELECT recording_id, name FROM watch_recordings WHERE fingerprint = ?",
                           [staged.fingerprint]).fetchone()
    con.execute("BEGIN TRANSACTION")
    try:
        if existing:
            result = WatchResult(existing[0], existing[1], False, str(staged.path))
        else:
            result = _insert(con, staged)
        _link_windows(con, result.recording_id, staged, run_ids)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    finally:
        drop_staged(con, staged)
    result.window_runs = [r[0] for r in con.execute(
        "SELECT run_id FROM watch_windows WHERE recording_id = ? ORDER BY start_iteration, attempt",
        [result.recording_id]).fetchall()]
    counts = con.execute("""SELECT count(DISTINCT rank), count(*), count(DISTINCT iteration) FROM watch_steps
                            WHERE recording_id = ?""", [result.recording_id]).fetchone()
    result.num_ranks, result.num_rows, result.num_iterations = counts
    result.num_triggers = con.execute("SELECT count(*) FROM watch_triggers WHERE recording_id = ?",
                                      [result.recording_id]).fetchone()[0]
    return result


def drop_staged(con: duckdb.DuckDBPyConnection, staged: Staged) -> None:
    for kind in ("steps", "groups"):
        for suffix in ("", "_files", "_hosts"):
            con.execute(f"DROP TABLE IF EXISTS _watch_{kind}_{staged.index}{suffix}")


def _insert(con, staged: Staged) -> WatchResult:
    i, live, launch = staged.index, staged.live, staged.launch
    name = _unique_name(con, staged.path.name or "run")
    command = launch.get("command")
    started_ns = launch.get("started_ns")
    recording_id = con.execute("""
        INSERT INTO watch_recordings (name, source_path, fingerprint, ingested_at, record_id, command, started_at,
                                      num_ranks, num_iterations, newest_complete_iteration, options)
        VALUES (?, ?, ?, ?, ?, ?, CASE WHEN ?::BIGINT IS NULL THEN NULL ELSE make_timestamptz(?::BIGINT // 1000) END,
                0, 0, ?, ?) RETURNING recording_id""",
        [name, str(staged.path), staged.fingerprint, datetime.now(timezone.utc), launch.get("run_id"),
         " ".join(command) if isinstance(command, list) else command, started_ns, started_ns,
         live.get("newest_complete_iteration"), json.dumps(live["options"]) if "options" in live else None]
    ).fetchone()[0]
    try:
        con.execute(f"""INSERT INTO watch_steps
            SELECT $id, s.rank, s.attempt, s.iteration, h.host, s.start_ns, s.end_ns, s.step_ns, s.busy_ns,
                   s.data_wait_ns, s.data_idle_ns, s.gc_ns, s.blocked_ns, s.windowed
            FROM _watch_steps_{i} s LEFT JOIN _watch_steps_{i}_hosts h USING (rank, attempt)""", {"id": recording_id})
        con.execute(f"""INSERT INTO watch_groups
            SELECT $id, rank, attempt, iteration, pg_name, pg_desc, sum(blocked_ns), sum(calls)
            FROM _watch_groups_{i} GROUP BY ALL""", {"id": recording_id})
    except duckdb.ConstraintException as exc:
        raise DataError(f"{staged.path / 'watch'}: an iteration appears twice in one rank folder ({_first_line(exc)})") from None
    con.execute("""UPDATE watch_recordings SET
                     num_ranks = (SELECT count(DISTINCT rank) FROM watch_steps WHERE recording_id = $id),
                     num_iterations = (SELECT count(DISTINCT iteration) FROM watch_steps WHERE recording_id = $id)
                   WHERE recording_id = $id""", {"id": recording_id})
    for k, t in enumerate(live.get("triggers") or []):
        con.execute("INSERT INTO watch_triggers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL)",
                    [recording_id, k, t["seen_at"], t["start"], t["steps"], t["rule"], t["rank"], t["reason"],
                     t["time_ns"]])
    for k, e in enumerate(live.get("episodes") or []):
        con.execute("INSERT INTO watch_episodes VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [recording_id, k, e["rule"], e["rank"], e["first_iteration"], e["last_iteration"],
                     e["worst_score"], bool(e["triggered"])])
    for s in live.get("scores") or []:
        con.execute("INSERT INTO watch_scores VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [recording_id, s["rank"], s.get("host"), s["iteration"], round(s["own_ns"]),
                     round(s["peers_own_ns"]), round(s["excess_ns"]), s["score"], s.get("slow_run", 0)])
    return WatchResult(recording_id, name, True, str(staged.path))


def _link_windows(con, recording_id: int, staged: Staged, run_ids: list[int]) -> None:
    """watch_windows rows for the window runs of this recording (the given runs, and any run of the
    same bprof record id), and each trigger's run: the window starting at its start iteration."""
    record_id = staged.launch.get("run_id")
    rows = con.execute("""
        SELECT run_id, json_extract_string(metadata, '$.window.window'),
               coalesce(CAST(json_extract(metadata, '$.window.attempt') AS INTEGER), 0), source_path,
               json_extract_string(metadata, '$.bprof.run_id') = $record_id
        FROM runs WHERE json_extract_string(metadata, '$.window.window') IS NOT NULL
          AND (list_contains($ids, run_id) OR json_extract_string(metadata, '$.bprof.run_id') = $record_id)""",
                       {"ids": list(run_ids), "record_id": record_id}).fetchall()
    reasons = _trigger_reasons(staged.path)
    for run_id, window, attempt, source, same_record in rows:
        start, _, end = window.partition(":")
        # a run given in the same ingest belongs here when its traces lie in this run directory
        inside = Path(source.split(";")[0]).resolve().is_relative_to(staged.path)
        if not (start.isdigit() and end.isdigit()) or not (same_record or inside):
            continue
        con.execute("""INSERT INTO watch_windows VALUES (?, ?, ?, ?, ?, ?, ?)
                       ON CONFLICT DO NOTHING""",
                    [recording_id, run_id, window, int(start), int(end), attempt, reasons.get((window, attempt))])
    con.execute("""UPDATE watch_triggers t SET run_id = w.run_id
                   FROM (SELECT start_iteration, min(run_id) AS run_id FROM watch_windows
                         WHERE recording_id = $id GROUP BY start_iteration) w
                   WHERE t.recording_id = $id AND t.start_iteration = w.start_iteration AND t.run_id IS NULL""",
                {"id": recording_id})


def _trigger_reasons(path: Path) -> dict[tuple[str, int], str]:
    """(window, attempt) -> the reason the ranks recorded with a triggered window (meta/rank<R>.json)."""
    out = {}
    for meta_path in sorted((path / "meta").glob("rank*.json")):
        meta = _read_json(meta_path, "bprof metadata")
        for w in meta.get("windows_captured") or []:
            if isinstance(w, dict) and w.get("trigger") and w.get("window"):
                out.setdefault((w["window"], int(w.get("attempt") or 0)), w["trigger"])
    return out


def _unique_name(con, base: str) -> str:
    """watch-<base>, unique among recordings and runs (bprof analyze NAME finds either)."""
    base = "watch-" + base
    taken = {r[0] for r in con.execute("""SELECT name FROM watch_recordings WHERE name = $b OR name LIKE $p
                                          UNION SELECT name FROM runs WHERE name = $b OR name LIKE $p""",
                                       {"b": base, "p": base + "-%"}).fetchall()}
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def _read_json(path: Path, what: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable {what} ({exc})") from None
    if not isinstance(value, dict):
        raise DataError(f"{path}: unreadable {what} (not a JSON object)")
    return value


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def ingest_recordings(con: duckdb.DuckDBPyConnection, paths: list[Path], options=None,
                      progress=None) -> tuple[list, list[WatchResult]]:
    """`bprof ingest PATH...` with watch files: every watched run directory among `paths` is read
    and checked first, then the runs (windows) are ingested (bprof.store.ingest), then each
    recording is stored and linked to its window runs. Returns (run results, watch results)."""
    from bprof.store.ingest import IngestOptions, ingest_paths

    watched = [Path(p) for p in paths if is_watched(Path(p))]
    staged: list[Staged] = []
    try:
        for k, path in enumerate(watched):
            staged.append(stage(con, path, k))
        traced = [Path(p) for p in paths if Path(p) not in watched or has_windows(Path(p))]
        results = ingest_paths(con, traced, options or IngestOptions(), progress) if traced else []
        ids = [r.run_id for r in results]
        return results, [store(con, s, ids) for s in staged]
    finally:
        for s in staged:
            drop_staged(con, s)


def has_windows(path: Path) -> bool:
    """A bprof record directory with at least one window folder under traces/."""
    return any(d.is_dir() and d.name.startswith("iteration_") for d in (Path(path) / "traces").glob("iteration_*"))


def watch_line(w: WatchResult, db) -> str:
    """What `bprof ingest` and `bprof record` say of a recording's watch series."""
    if not w.created:
        return f"watch series already ingested as recording {w.recording_id} ({w.name}); nothing changed in {db}"
    windows = (f"window runs {', '.join(map(str, w.window_runs))} linked to it" if w.window_runs
               else f"no window was captured (`bprof analyze {w.name}` shows the series)")
    return (f"ingested the watch series of recording {w.recording_id} ({w.name}) into {db}: {w.num_ranks} ranks, "
            f"{w.num_iterations} iterations ({w.num_rows:,} rows), {w.num_triggers} triggered window(s); {windows}")
