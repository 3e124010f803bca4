"""Ingest per-rank Kineto traces into the store, one transaction per run.

Each file is streamed into a work file holding just its events array (threads, so gzip
inflation of one rank overlaps DuckDB's scan of the previous batch); DuckDB's JSON reader then
scans batches of ranks natively. A run of `bprof reduce` outputs loads their Parquet tables
instead (ingest_reduced_run). Any failure rolls the run back: the store is left as it was.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import duckdb

from bprof.errors import DataError, UsageError
from bprof.store.chrome_export import CALLS_META_KEY, is_export, unpack_export
from bprof.store.discover import RunFiles, discover, rank_of, record_meta_paths
from bprof.store.exec_trace import load_exec_traces
from bprof.store.kineto_file import NotATrace, SplitTrace, split_trace
from bprof.store.limits import set_memory_limit
from bprof.store.reduce import check_one_run, file_sha256, load_reduced, read_manifest
from bprof.store.sqlfile import run_sql_file
from bprof.store.supersede import replace_partials

_MALFORMED = re.compile(r'file "([^"]+)", at byte (\d+)(?: in record/value \d+)?: (.*)', re.DOTALL)


@dataclass(frozen=True)
class IngestOptions:
    name: str | None = None  # run name; default: the directory (or file) name, made unique
    rank: int | None = None  # rank of a single file that does not say it
    workers: int = 2  # threads splitting (inflating) files
    batch_files: int = 8  # ranks scanned by one DuckDB query
    work_dir: Path | None = None  # where the events arrays are staged (default: system temp)
    memory_limit: str = "600MB"  # DuckDB's buffer limit while ingesting; past it, DuckDB spills to disk
    reduced: bool = False  # where a directory holds traces and `bprof reduce` outputs, take the latter
    # CI history labels; each given one replaces what the capture recorded (git_sha, git_branch)
    benchmark: str | None = None  # groups comparable runs (bprof ci)
    tags: tuple[str, ...] = ()
    git_branch: str | None = None
    git_sha: str | None = None


@dataclass
class IngestResult:
    run_id: int
    name: str
    created: bool  # False when the same files were ingested before
    num_ranks: int = 0
    num_events: int = 0
    uncompressed_bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    reduced_bytes: int = 0  # a run of reduced outputs: their Parquet and manifest bytes (no events)
    # each rank's metadata as the runs row was made from it (bprof reduce keeps it); not printed
    metadata_by_rank: dict[int, dict] = field(default_factory=dict, repr=False)

    def summary(self) -> dict:
        """What `bprof ingest --json` prints."""
        return {k: v for k, v in self.__dict__.items() if k != "metadata_by_rank"}


Progress = Callable[[int, int], None]  # (files done, files total)


def ingest_paths(con: duckdb.DuckDBPyConnection, paths: list[Path], options: IngestOptions = IngestOptions(),
                 progress: Progress | None = None) -> list[IngestResult]:
    """Ingest every run found under `paths` (usually one); see discover() for the layouts."""
    runs = discover([Path(p) for p in paths], prefer_reduced=options.reduced)
    if options.rank is not None and (len(runs) != 1 or len(runs[0].files) != 1):
        raise UsageError("--rank applies to a single trace file only")
    if options.name is not None and len(runs) > 1:
        raise UsageError(f"--name names one run, but these paths hold {len(runs)} runs")
    return [(ingest_reduced_run if run.reduced else ingest_run)(con, run, options, progress) for run in runs]


def ingest_run(con: duckdb.DuckDBPyConnection, run: RunFiles, options: IngestOptions,
               progress: Progress | None = None) -> IngestResult:
    hashes = _hash_files(run.files, options.workers)
    fingerprint = hashlib.sha256("".join(sorted(hashes.values())).encode()).hexdigest()
    existing, name = _existing_or_name(con, fingerprint, options, run)
    if existing:
        return existing
    set_memory_limit(con, options.memory_limit)
    con.execute("BEGIN TRANSACTION")
    try:
        result = _ingest_in_transaction(con, run, name, fingerprint, hashes, options, progress)
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    return result


def _ingest_in_transaction(con, run: RunFiles, name: str, fingerprint: str, hashes: dict[Path, str],
                           options: IngestOptions, progress: Progress | None) -> IngestResult:
    run_id = _insert_run(con, run, name, fingerprint)
    result = IngestResult(run_id, name, created=True)
    seen_ranks: dict[int, Path] = {}
    metas: dict[int, dict] = {}
    skipped: list[str] = []
    done = 0
    with tempfile.TemporaryDirectory(prefix="bprof-ingest-", dir=options.work_dir) as tmp, \
            ThreadPoolExecutor(max(1, options.workers)) as pool:
        batches = [run.files[i:i + options.batch_files] for i in range(0, len(run.files), options.batch_files)]
        pending = _submit_batch(pool, batches[0], Path(tmp), 0, run.named) if batches else []
        for b, files in enumerate(batches):
            results = [f.result() for f in pending]
            splits = [s for found, _ in results for s in found]
            skipped += [why for _, why in results if why]
            # start inflating the next batch while DuckDB scans this one
            pending = _submit_batch(pool, batches[b + 1], Path(tmp), b + 1, run.named) if b + 1 < len(batches) else []
            batch = []
            for split in splits:
                rank = rank_of(split.path, split.metadata, options.rank)
                if rank in seen_ranks:
                    raise DataError(f"{split.path}: duplicate rank {rank} in one run (also in {seen_ranks[rank]})")
                seen_ranks[rank] = split.path
                metas[rank] = split.metadata
                batch.append((rank, split))
            if batch:
                _load_batch(con, run_id, batch, hashes)
            for _, split in batch:
                for part in split.array_paths:
                    part.unlink(missing_ok=True)
                result.uncompressed_bytes += split.uncompressed_bytes
            done += len(files)
            if progress:
                progress(done, len(run.files))
    if not seen_ranks:
        raise DataError("no trace among the files: " + "; ".join(skipped))
    _run_sql(con, "ingest_collectives.sql", run_id)
    recorded = _load_recorded_meta(con, run_id, seen_ranks)
    _run_sql(con, "ingest_flight_recorder.sql", run_id)
    con.execute("DROP TABLE _flight_recorder; DROP TABLE _pg_members; DROP TABLE _fr_files")
    _load_export_calls(con, run_id, metas)
    load_exec_traces(con, run_id, seen_ranks)
    for rank, meta in recorded.items():
        metas[rank] = {**metas[rank], "bprof_record": meta}
    window, window_warnings = recorded_window(seen_ranks, recorded)
    result.warnings = skipped + window_warnings + _finish_run(con, run_id, metas, window)
    _label_run(con, run_id, options)
    result.name, replaced = replace_partials(con, run_id, name, keep_name=options.name is not None)
    result.warnings += replaced
    result.num_ranks = len(seen_ranks)
    result.num_events = con.execute("SELECT sum(num_events) FROM ranks WHERE run_id = ?", [run_id]).fetchone()[0]
    result.metadata_by_rank = metas
    return result


def ingest_reduced_run(con: duckdb.DuckDBPyConnection, run: RunFiles, options: IngestOptions,
                       progress: Progress | None = None) -> IngestResult:
    """A run from `bprof reduce` outputs (bprof.store.reduce): every file is checked against its
    manifest before the run's one transaction loads them; the run has no events."""
    if options.rank is not None:
        raise UsageError("--rank applies to trace files; a reduced output names its rank")
    manifests = [read_manifest(d) for d in run.files]
    check_one_run(manifests)
    fingerprint = hashlib.sha256("".join(sorted(m.sha256 for m in manifests)).encode()).hexdigest()
    existing, name = _existing_or_name(con, fingerprint, options, run)
    if existing:
        return existing
    con.execute("BEGIN TRANSACTION")
    try:
        run_id = _insert_run(con, run, name, fingerprint)
        load_reduced(con, run_id, manifests)
        warnings = _finish_run(con, run_id, {m.rank: m.metadata for m in manifests})
        _label_run(con, run_id, options)
        name, replaced = replace_partials(con, run_id, name, keep_name=options.name is not None)
        warnings += replaced
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    if progress:
        progress(len(manifests), len(manifests))
    return IngestResult(run_id, name, created=True, num_ranks=len(manifests), warnings=warnings,
                        reduced_bytes=sum(m.num_bytes for m in manifests))


def _insert_run(con, run: RunFiles, name: str, fingerprint: str) -> int:
    """The run's row, filled in by _finish_run once its ranks are in."""
    return con.execute(
        "INSERT INTO runs (name, ingested_at, source_path, fingerprint, num_ranks_ingested, consistent) "
        "VALUES (?, ?, ?, ?, 0, true) RETURNING run_id",
        [name, datetime.now(timezone.utc), ";".join(str(f) for f in run.files), fingerprint],
    ).fetchone()[0]


def _submit_batch(pool: ThreadPoolExecutor, files, tmp: Path, batch_index: int, named: frozenset[Path]):
    return [pool.submit(_split, f, tmp / f"b{batch_index}-{i}.json", f not in named) for i, f in enumerate(files)]


def _split(path: Path, array_path: Path, skip_non_trace: bool) -> tuple[list[SplitTrace], str | None]:
    """A trace file's events array(s) and metadata: one per rank (a `bprof export --perfetto` file
    holds several). A JSON object without traceEvents found in a directory (a config or sidecar
    beside the rank traces) is skipped: no split, and the warning that names it."""
    try:
        split = split_trace(path, array_path)
    except NotATrace:
        if not skip_non_trace:
            raise
        return [], f"{path}: skipped, not a trace (a JSON object without a traceEvents array)"
    return (unpack_export(split, array_path) if is_export(split.metadata) else [split]), None


def _load_export_calls(con, run_id: int, metas: dict[int, dict]) -> None:
    """Ranks from a `bprof export --perfetto` file: give their collective calls the process group,
    sequence number and peer the exported run had (chrome_export.CALL_KEY)."""
    rows = [row for meta in metas.values() for row in meta.pop(CALLS_META_KEY, ())]
    if not rows:
        return
    con.execute("""CREATE OR REPLACE TEMP TABLE _export_calls (rank INTEGER, tid VARCHAR, cpu_ts_ns BIGINT,
                   op VARCHAR, pg_name VARCHAR, pg_desc VARCHAR, pg_ranks INTEGER[], group_size INTEGER, seq BIGINT,
                   peer_rank INTEGER, dtype VARCHAR, in_elems BIGINT, out_elems BIGINT, in_bytes BIGINT,
                   out_bytes BIGINT)""")
    columns = [list(c) for c in zip(*rows)]  # one parameter per column: executemany is slow per row
    con.execute("INSERT INTO _export_calls SELECT " + ", ".join(f"unnest(${i + 1})" for i in range(len(columns))),
                columns)
    _run_sql(con, "ingest_export_calls.sql", run_id)
    con.execute("DROP TABLE _export_calls")


def _load_batch(con, run_id: int, batch: list[tuple[int, SplitTrace]], hashes: dict[Path, str]) -> None:
    """Scan one batch of events arrays into events/steps and describe its ranks."""
    con.execute("CREATE OR REPLACE TEMP TABLE _batch_files (array_path VARCHAR, rank INTEGER, base_ns BIGINT)")
    con.executemany("INSERT INTO _batch_files VALUES (?, ?, ?)",
                    [[str(p), rank, _base_ns(s.metadata)] for rank, s in batch for p in s.array_paths])
    paths = [str(p) for _, s in batch for p in s.array_paths]
    try:
        _run_sql(con, "ingest_events.sql", run_id, {"paths": paths})
    except duckdb.Error as exc:
        raise _bad_json(exc, batch) from None
    _run_sql(con, "ingest_steps.sql", run_id)
    stats = {row[0]: row[1:] for row in con.execute("""
        SELECT rank, count(*), min(ts_ns) FILTER (WHERE kind <> 'metadata'),
               max(ts_ns + dur_ns) FILTER (WHERE kind <> 'metadata'),
               mode(device) FILTER (WHERE kind = 'kernel'),
               mode(TRY_CAST(pid AS BIGINT)) FILTER (WHERE kind = 'cpu_op')
        FROM events WHERE run_id = ? AND rank IN (SELECT rank FROM _batch_files) GROUP BY rank""",
        [run_id]).fetchall()}
    for rank, split in batch:
        meta = split.metadata
        num_events, first_ts, last_ts, device_index, pid = stats.get(rank, (0, None, None, None, None))
        bprof_meta = meta.get("bprof") if isinstance(meta.get("bprof"), dict) else {}
        con.execute(
            "INSERT INTO ranks VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL, ?, ?)",
            [run_id, rank, bprof_meta.get("local_rank"), bprof_meta.get("host") or meta.get("host_name"),
             pid, _device_name(meta, device_index), device_index, str(split.path), hashes[split.path],
             split.uncompressed_bytes, "relative_base" if "baseTimeNanoseconds" in meta else "absolute_us",
             _base_ns(meta), first_ts, last_ts, num_events,
             _json_or_none(meta.get("distributedInfo")), _json_or_none(meta.get("deviceProperties"))],
        )
    con.execute("DROP TABLE _batch_steps; DROP TABLE _batch_files")


def _load_recorded_meta(con, run_id: int, ranks: dict[int, Path]) -> dict[int, dict]:
    """`bprof record` traces: per-rank metadata and clock samples into the store, and the
    window's Flight Recorder entries into the temp table _flight_recorder (read by DuckDB)."""
    metas, fr_files, clock_rows = {}, [], []
    for rank, trace in ranks.items():
        paths = record_meta_paths(trace, rank)
        if paths is None:
            continue
        meta_path, fr_path = paths
        if meta_path.exists():
            metas[rank] = meta = _read_json(meta_path)
            for sync in meta.get("clock_sync") or []:
                clock_rows += [[run_id, rank, sync["reference_rank"], sync["phase"], *sample] for sample in sync["samples"]]
        if fr_path.exists():
            fr_files.append([str(fr_path), rank])
    if clock_rows:
        con.executemany("INSERT INTO clock_samples VALUES (?, ?, ?, ?, ?, ?, ?)", clock_rows)
    con.execute("CREATE OR REPLACE TEMP TABLE _fr_files (path VARCHAR, rank INTEGER)")
    if fr_files:
        con.executemany("INSERT INTO _fr_files VALUES (?, ?)", fr_files)
    if not fr_files:  # not a bprof record run: an empty table, so one code path follows
        con.execute("""CREATE OR REPLACE TEMP TABLE _flight_recorder (rank INTEGER, pg_name VARCHAR, pg_desc VARCHAR,
                       seq BIGINT, profiling_name VARCHAR, time_created_ns BIGINT, time_done_ns BIGINT,
                       is_p2p BOOLEAN, peer_rank INTEGER, dtype VARCHAR, in_elems BIGINT, out_elems BIGINT)""")
        return metas
    try:
        _run_sql(con, "ingest_fr_entries.sql", None, {"paths": [p for p, _ in fr_files]})
    except duckdb.Error as exc:
        raise DataError(f"{', '.join(p for p, _ in fr_files)}: unreadable Flight Recorder entries ({exc})") from None
    return metas


def recorded_window(traces: dict[int, Path], recorded: dict[int, dict]) -> tuple[dict | None, list[str]]:
    """A `bprof record` window as its ranks' metadata tell it (runs.metadata.window): the window,
    the launcher's attempt that wrote it (torchrun restarts), the ranks whose window was cut before
    its end (partial) and at which iteration, and the restart that cut it; with a warning when cut."""
    entries = {}
    for rank, meta in recorded.items():
        relative = traces[rank].relative_to(traces[rank].parents[2]).as_posix()  # traces/iteration_N/rankR.json.gz
        entries.update({rank: w for w in meta.get("windows_captured") or [] if w.get("trace") == relative})
    if not entries:
        return None, []
    first = entries[min(entries)]
    cut = {r: w.get("cut_at_iteration") for r, w in sorted(entries.items()) if w.get("partial")}
    restarts = sorted({w["cut_by_restart"] for w in entries.values() if w.get("cut_by_restart") is not None})
    window = {"window": first.get("window"), "attempt": first.get("attempt", 0), "cut_ranks": sorted(cut),
              "cut_at_iteration": {str(r): i for r, i in cut.items()}, "cut_by_restart": restarts[0] if restarts else None}
    if not cut:
        return window, []
    where = ", ".join(f"rank {r} at iteration {i}" for r, i in cut.items())
    why = (f"cut by the launcher's restart {restarts[0]} (its windows are runs of their own)" if restarts
           else "ended before its last step (the job stopped)")
    return window, [f"window {window['window']} of attempt {window['attempt']} was {why}: {where}; "
                    "the step running then is incomplete"]


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable bprof metadata ({exc})") from None


def _finish_run(con, run_id: int, metas: dict[int, dict], window: dict | None = None) -> list[str]:
    """Fill the run row from its ranks and flag files that cannot belong to one job window."""
    dists = {r: m.get("distributedInfo") or {} for r, m in metas.items()}
    world_sizes = {d.get("world_size") for d in dists.values() if d.get("world_size") is not None}
    if not world_sizes:  # no process group (a world of 1): what bprof record decided, if it recorded
        world_sizes = {m["bprof"].get("world_size") for m in metas.values()
                       if isinstance(m.get("bprof"), dict) and isinstance(m["bprof"].get("world_size"), int)}
    backends = {d.get("backend") for d in dists.values() if d.get("backend")}
    run_ids = {m["bprof"].get("run_id") for m in metas.values()
               if isinstance(m.get("bprof"), dict) and m["bprof"].get("run_id")}
    problems = []
    if len(world_sizes) > 1:
        problems.append(f"world sizes disagree ({sorted(world_sizes)})")
    if len(backends) > 1:
        problems.append(f"backends disagree ({sorted(backends)})")
    if len(run_ids) > 1:
        problems.append(f"bprof run ids disagree ({sorted(run_ids)})")
    step_sets = con.execute(
        "SELECT rank, list(step ORDER BY step) FROM steps WHERE run_id = ? GROUP BY rank ORDER BY rank", [run_id]
    ).fetchall()
    distinct_steps = {tuple(s) for _, s in step_sets}
    if len(distinct_steps) > 1:
        shown = "; ".join(f"rank {r}: {_span(s)}" for r, s in step_sets[:4])
        problems.append(f"step numbers disagree ({shown}{'; ...' if len(step_sets) > 4 else ''})")
    warnings = []
    if problems:
        warnings.append("these files do not look like one job and step window: " + ", ".join(problems)
                        + "; cross-rank analyses will answer 'not measurable' for this run")
    world_size = max(world_sizes) if world_sizes else None
    missing = [r for r in range(world_size) if r not in metas] if world_size else None
    if missing:
        warnings.append(f"{len(metas)} of {world_size} ranks ingested (partial run; missing ranks {rank_ranges(missing)})")
    model = next((m.get("bprof_model") for m in metas.values() if m.get("bprof_model") is not None), None)
    if isinstance(model, str):
        model = json.loads(model)
    bprof_meta = next((m["bprof"] for m in metas.values() if isinstance(m.get("bprof"), dict)), {})
    recorded = next((m["bprof_record"] for _, m in sorted(metas.items()) if "bprof_record" in m), {})
    bprof_meta = {**bprof_meta, **{k: recorded[k] for k in ("command", "git_sha", "git_branch") if recorded.get(k)}}
    model = model or recorded.get("model") or None
    if isinstance(bprof_meta.get("command"), list):
        bprof_meta["command"] = " ".join(bprof_meta["command"])
    lowest = min(metas)
    con.execute(
        """UPDATE runs SET
             started_at = (SELECT make_timestamptz(min(first_ts_ns) // 1000) FROM ranks WHERE run_id = $run_id),
             world_size = $world_size, num_ranks_ingested = $num_ranks, missing_ranks = $missing, backend = $backend,
             device_name = (SELECT device_name FROM ranks WHERE run_id = $run_id AND rank = $lowest),
             model_flops_per_step = $model_flops, consistent = $consistent, inconsistency = $inconsistency,
             command = $command, git_sha = $git_sha, git_branch = $git_branch, metadata = $metadata
           WHERE run_id = $run_id""",
        {"run_id": run_id, "world_size": world_size, "num_ranks": len(metas), "missing": missing,
         "backend": next(iter(backends)) if len(backends) == 1 else None, "lowest": lowest,
         "model_flops": (model or {}).get("model_flops_per_step"), "consistent": not problems,
         "inconsistency": ", ".join(problems) or None, "command": bprof_meta.get("command"),
         "git_sha": bprof_meta.get("git_sha"), "git_branch": bprof_meta.get("git_branch"),
         "metadata": json.dumps({"bprof": bprof_meta, "bprof_model": model,
                                 "environment": {k: recorded[k] for k in ENVIRONMENT_FACTS if k in recorded}}
                                | ({"window": window} if window else {}))},
    )
    return warnings


# what `bprof record` notes of each rank's software (rank_hook._environment_facts), kept in runs.metadata
# so that CI can refuse to compare runs of different torch, CUDA or NCCL versions or thread counts
ENVIRONMENT_FACTS = ("torch_version", "cuda_version", "nccl_version", "intra_op_threads")


def _label_run(con, run_id: int, options: IngestOptions) -> None:
    """The CI labels given to ingest (or record): each one given replaces what the capture said."""
    con.execute(
        """UPDATE runs SET benchmark = coalesce($benchmark, benchmark),
             tags = CASE WHEN len($tags) > 0 THEN $tags ELSE tags END,
             git_branch = coalesce($git_branch, git_branch), git_sha = coalesce($git_sha, git_sha)
           WHERE run_id = $run_id""",
        {"run_id": run_id, "benchmark": options.benchmark, "tags": list(options.tags),
         "git_branch": options.git_branch, "git_sha": options.git_sha})


def _run_sql(con, filename: str, run_id: int | None, params: dict | None = None) -> None:
    bound = dict(params or {})
    if run_id is not None:
        bound["run_id"] = run_id
    run_sql_file(con, "bprof.store", filename, bound)


def _bad_json(exc: duckdb.Error, batch: list[tuple[int, SplitTrace]]) -> DataError:
    message = str(exc)
    match = _MALFORMED.search(message)
    by_part = {str(p): (s, k) for _, s in batch for k, p in enumerate(s.array_paths)}
    if match and match.group(1) in by_part:
        split, k = by_part[match.group(1)]
        where, reason = _pinpoint(split.array_paths[k])
        reason = reason or match.group(3).strip().splitlines()[0].rstrip(". ")
        return DataError(f"{split.path}: invalid JSON at byte {split.part_offsets[k] + where} of the uncompressed trace ({reason})")
    names = ", ".join(str(s.path) for _, s in batch)
    first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    return DataError(f"{names}: events could not be read ({first})")


def _pinpoint(array_path: Path) -> tuple[int, str | None]:
    """Find the first bad character of an events array (DuckDB names only the bad record).

    Runs only on the error path: a streaming Python parse, record by record, in 8 MB chunks.
    """
    decoder = json.JSONDecoder()
    consumed = 0  # bytes of the file before `text`
    with array_path.open("rb") as f:
        text = f.read(8 << 20).decode("utf-8", errors="replace")
        i = 1  # after the opening [
        while True:
            while i < len(text) and text[i] in " \t\r\n,":
                i += 1
            if i < len(text) and text[i] == "]":
                return consumed + len(text[:i].encode()), None
            try:
                _, i = decoder.raw_decode(text, i)
            except json.JSONDecodeError as exc:
                more = f.read(8 << 20)
                if more and exc.pos >= len(text) - 1_000_000:
                    consumed += len(text[:i].encode())
                    text = text[i:] + more.decode("utf-8", errors="replace")
                    i = 0
                    continue
                return consumed + len(text[:exc.pos].encode()), exc.msg.lower()


def _hash_files(files: tuple[Path, ...], workers: int) -> dict[Path, str]:
    with ThreadPoolExecutor(max(1, workers)) as pool:
        return dict(zip(files, pool.map(file_sha256, files)))


def _existing_or_name(con, fingerprint: str, options: IngestOptions, run: RunFiles) -> tuple[IngestResult | None, str]:
    """The run already ingested from these very files (ingest is idempotent), else the name the new
    run gets: --name when no other run has it, or the default name made unique."""
    existing = con.execute("SELECT run_id, name FROM runs WHERE fingerprint = ?", [fingerprint]).fetchone()
    if existing:
        return IngestResult(existing[0], existing[1], created=False), existing[1]
    if options.name is not None and con.execute("SELECT 1 FROM runs WHERE name = ?", [options.name]).fetchone():
        raise UsageError(f"a run named {options.name!r} already exists with other files; pick another --name")
    return None, options.name or _unique_name(con, run.default_name)


def _unique_name(con, base: str) -> str:
    taken = {r[0] for r in con.execute("SELECT name FROM runs WHERE name = ? OR name LIKE ?",
                                       [base, base + "-%"]).fetchall()}
    if base not in taken:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def _base_ns(meta: dict) -> int:
    base = meta.get("baseTimeNanoseconds")
    return int(base) if isinstance(base, (int, float)) else 0


def _device_name(meta: dict, device_index: int | None) -> str:
    if device_index is None:
        return "cpu"
    for prop in meta.get("deviceProperties") or []:
        if isinstance(prop, dict) and prop.get("id") == device_index:
            return str(prop.get("name"))
    return f"device {device_index}"


def _json_or_none(value) -> str | None:
    return None if value is None else json.dumps(value)


def rank_ranges(ranks: list[int]) -> str:
    """[1, 2, 3, 7] -> '1-3, 7'."""
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


def _span(steps: list[int]) -> str:
    if not steps:
        return "none"
    return f"{steps[0]}" if len(steps) == 1 else f"{steps[0]}-{steps[-1]} ({len(steps)})"
