"""Open, create and migrate the bprof DuckDB store.

The schema lives in schema.sql (version SCHEMA_VERSION). A file written by an older bprof is
migrated in place by the steps in MIGRATIONS; a file from a newer bprof is refused, not guessed at.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import duckdb

from bprof.errors import DataError, UsageError

SCHEMA_VERSION = 1
DEFAULT_DB = Path("bprof.duckdb")

# version N -> SQL that turns a version-N store into version N+1. Empty until the schema changes.
MIGRATIONS: dict[int, str] = {}


def schema_sql() -> str:
    return resources.files("bprof.store").joinpath("schema.sql").read_text()


def open_store(path: Path | str = DEFAULT_DB, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """Connect to the store at `path`, creating it (or migrating it) when needed.

    Read-only opening of a missing file is a usage error; a store of a newer schema is a data
    error naming both versions.
    """
    path = Path(path)
    if read_only and not path.exists():
        raise UsageError(f"{path}: no bprof store here (run `bprof ingest` first, or pass --db)")
    try:
        con = duckdb.connect(str(path), read_only=read_only)
    except duckdb.Error as exc:
        raise DataError(f"{path}: cannot open as a DuckDB store ({_first_line(exc)})") from None
    # DuckDB's own progress bar would print to stdout, into --json output; bprof shows its own
    con.execute("SET enable_progress_bar = false")
    try:
        version = _schema_version(con)
        if version is None:
            if read_only:
                raise DataError(f"{path}: a DuckDB file but not a bprof store (no meta table)")
            _create(con)
        elif version > SCHEMA_VERSION:
            raise DataError(
                f"{path}: written by a newer bprof (schema {version}; this bprof reads up to "
                f"{SCHEMA_VERSION}); upgrade bprof to read it"
            )
        elif version < SCHEMA_VERSION:
            if read_only:
                raise DataError(f"{path}: schema {version} needs migrating to {SCHEMA_VERSION}; open it once without read-only")
            _migrate(con, version)
    except BaseException:
        con.close()
        raise
    return con


def _schema_version(con: duckdb.DuckDBPyConnection) -> int | None:
    has_meta = con.execute(
        "SELECT count(*) FROM duckdb_tables() WHERE table_name = 'meta' AND schema_name = 'main'"
    ).fetchone()[0]
    if not has_meta:
        return None
    row = con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    return int(row[0]) if row else None


def _create(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        con.execute(schema_sql())
        con.execute("INSERT INTO meta VALUES ('schema_version', ?), ('created_by', 'bprof')",
                    [str(SCHEMA_VERSION)])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _migrate(con: duckdb.DuckDBPyConnection, version: int) -> None:
    con.execute("BEGIN TRANSACTION")
    try:
        for v in range(version, SCHEMA_VERSION):
            if v not in MIGRATIONS:
                raise DataError(f"no migration from schema {v} to {v + 1}")
            con.execute(MIGRATIONS[v])
        con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", [str(SCHEMA_VERSION)])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
