"""The reduced format, the contract between `bprof reduce` (one rank's compact tables, written where
the rank ran) and ingest (a run loaded from those tables alone, in one transaction).

Layout of one rank: a directory `rank<R>.reduced/` holding
  manifest.json        format name and version, the rank, the trace it came from, the rank's run
                       facts (what ingest needs for the runs row), and each file's rows, bytes, sha256
  <name>.parquet       one zstd Parquet file per entry of TABLES: the store table's columns, no run_id
Ingest checks every file against its manifest before reading it, so a truncated or altered file is
named, not half-loaded. A new FORMAT_VERSION is refused by an older bprof, and the other way round.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from bprof.errors import DataError

FORMAT = "bprof-reduced"
FORMAT_VERSION = 1
SUFFIX = ".reduced"
MANIFEST = "manifest.json"

# file name (without .parquet) -> the store table its rows go to; the file has that table's
# columns except run_id. ranks, steps, collectives and clock_samples are the store's own rows of
# the rank; spans, breakdown, exposed_comm and dims are what the timeline and breakdown analyzers
# computed from its events (see bprof.analyzers.reduce), which analysis copies for reduced ranks.
# A manifest that lacks one of them (as from an earlier development version, which lacked dims) is
# refused, naming the file.
TABLES = {
    "ranks": "ranks",
    "steps": "steps",
    "collectives": "collectives",
    "clock_samples": "clock_samples",
    "spans": "reduced_spans",
    "breakdown": "reduced_breakdown",
    "exposed_comm": "reduced_exposed_comm",
    "dims": "reduced_dims",
}


@dataclass(frozen=True)
class Manifest:
    """A checked manifest.json of one reduced rank."""

    path: Path  # the rank<R>.reduced directory
    rank: int
    raw: dict
    sha256: str  # of manifest.json (which holds every table file's sha256): the rank's fingerprint
    num_bytes: int  # manifest and Parquet files together

    @property
    def metadata(self) -> dict:
        """The rank's run facts, shaped as ingest's per-rank metadata (distributedInfo, bprof, ...)."""
        return self.raw.get("metadata") or {}

    @property
    def run_key(self) -> tuple:
        """What must agree between the ranks of one run: bprof record's run id, the window, the world size."""
        bprof_meta = self.metadata.get("bprof") if isinstance(self.metadata.get("bprof"), dict) else {}
        dist = self.metadata.get("distributedInfo") if isinstance(self.metadata.get("distributedInfo"), dict) else {}
        return (bprof_meta.get("run_id") or None, self.raw.get("trace", {}).get("window"), dist.get("world_size"))

    def table_path(self, name: str) -> Path:
        return self.path / f"{name}.parquet"


def is_reduced_dir(path: Path) -> bool:
    return path.is_dir() and path.name.endswith(SUFFIX)


def reduced_dirs(directory: Path) -> tuple[Path, ...]:
    """Every rank<R>.reduced directory under `directory` (not inside another one)."""
    found = [p for p in directory.rglob(f"*{SUFFIX}") if p.is_dir()]
    return tuple(sorted(p for p in found if not any(q.name.endswith(SUFFIX) for q in p.parents)))


def file_sha256(path: Path) -> str:
    """The file's sha256, read in 8 MiB chunks; an unreadable file is a DataError naming it."""
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(8 << 20):
                h.update(chunk)
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror})") from None
    return h.hexdigest()


def read_manifest(directory: Path) -> Manifest:
    """Read and check one reduced rank: format, version, and every table file against its size and
    sha256. A DataError names the file at fault."""
    path = directory / MANIFEST
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise DataError(f"{path}: cannot read the manifest of a reduced rank ({exc.strerror}); "
                        "is this a complete `bprof reduce` output?") from None
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise DataError(f"{path}: not a bprof reduce manifest (format is not {FORMAT!r})")
    if raw.get("version") != FORMAT_VERSION:
        raise DataError(f"{path}: reduced format version {raw.get('version')!r}, but this bprof reads version "
                        f"{FORMAT_VERSION}; run `bprof reduce` on the rank's trace again with this bprof")
    if not isinstance(raw.get("rank"), int):
        raise DataError(f"{path}: the manifest names no rank")
    listed = raw.get("tables") if isinstance(raw.get("tables"), dict) else {}
    total = len(text)
    for name in TABLES:
        entry, table = listed.get(name), directory / f"{name}.parquet"
        if not isinstance(entry, dict):
            raise DataError(f"{path}: the manifest lists no {name}.parquet; run `bprof reduce` on the rank's trace "
                            "again with this bprof")
        try:
            size = table.stat().st_size
        except OSError:
            raise DataError(f"{table}: missing (the manifest lists it)") from None
        if size != entry.get("bytes"):
            raise DataError(f"{table}: {size} bytes, but its manifest says {entry.get('bytes')} (truncated or replaced)")
        if file_sha256(table) != entry.get("sha256"):
            raise DataError(f"{table}: its sha256 differs from the manifest's (corrupt or modified)")
        total += size
    return Manifest(directory, raw["rank"], raw, hashlib.sha256(text).hexdigest(), total)


def check_one_run(manifests: list[Manifest]) -> None:
    """Reduced ranks make one run only if no two claim the same rank and all agree on the run."""
    by_rank: dict[int, Manifest] = {}
    for m in manifests:
        if m.rank in by_rank:
            raise DataError(f"{m.path}: duplicate rank {m.rank} in one run (also in {by_rank[m.rank].path})")
        by_rank[m.rank] = m
    first = manifests[0]
    for m in manifests[1:]:
        for what, a, b in zip(("bprof run id", "capture window", "world size"), first.run_key, m.run_key):
            if a is not None and b is not None and a != b:
                raise DataError(f"{m.path}: from another run than {first.path} ({what} {b!r} against {a!r}); "
                                "ingest each run's reduced outputs separately")


def load_reduced(con: duckdb.DuckDBPyConnection, run_id: int, manifests: list[Manifest]) -> None:
    """Insert every table of the reduced ranks into the store (inside the caller's transaction):
    one scan per table over all ranks' files."""
    con.execute("CREATE OR REPLACE TEMP TABLE _reduced_files (path VARCHAR, rank INTEGER)")
    for name, target in TABLES.items():
        files = [str(m.table_path(name)) for m in manifests]
        con.execute("DELETE FROM _reduced_files")
        con.executemany("INSERT INTO _reduced_files VALUES (?, ?)", [[f, m.rank] for f, m in zip(files, manifests)])
        try:
            con.execute("CREATE OR REPLACE TEMP TABLE _reduced_rows AS "
                        "SELECT * FROM read_parquet(?, filename = true, union_by_name = true)", [files])
            wrong = con.execute("""SELECT f.path, f.rank, any_value(r.rank) FROM _reduced_rows r JOIN _reduced_files f
                                   ON f.path = r.filename WHERE r.rank IS DISTINCT FROM f.rank GROUP BY ALL LIMIT 1""").fetchone()
        except duckdb.Error as exc:
            raise _unreadable(exc, files) from None
        if wrong:
            raise DataError(f"{wrong[0]}: holds rows of rank {wrong[2]}, but its manifest is rank {wrong[1]}")
        try:
            # the target's name is one of TABLES' constants, never user input
            con.execute(f"INSERT INTO {target} BY NAME SELECT ? AS run_id, * EXCLUDE (filename) FROM _reduced_rows", [run_id])
        except duckdb.Error as exc:
            raise _unreadable(exc, files, f"its rows do not fit the store's {target} table") from None
    con.executemany("INSERT INTO reduced_ranks VALUES (?, ?, ?, ?, ?, ?, ?)", [
        [run_id, m.rank, str(m.path), m.raw["version"], m.raw.get("bprof_version"), _timestamp(m.raw.get("reduced_at")),
         m.num_bytes] for m in manifests])
    con.execute("DROP TABLE _reduced_rows; DROP TABLE _reduced_files")


def _unreadable(exc: duckdb.Error, files: list[str], why: str = "unreadable Parquet") -> DataError:
    message = str(exc)
    named = [f for f in files if f in message]
    first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    return DataError(f"{', '.join(named or files[:3])}{'' if named or len(files) <= 3 else ', ...'}: {why} ({first})")


def _timestamp(text) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat()


@contextlib.contextmanager
def replaced_dir(out: Path):
    """Yield an empty temporary sibling of `out` to fill; when the block ends, it replaces `out`
    (whole or not at all); on any error it is removed and `out` is left as it was."""
    staging = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
        if out.exists():
            shutil.rmtree(out)
        staging.replace(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
