"""DuckDB's memory limit for one connection: past it DuckDB spills to disk instead of growing."""

from __future__ import annotations

import re

import duckdb

from bprof.errors import UsageError


def set_memory_limit(con: duckdb.DuckDBPyConnection, size: str) -> None:
    """SET memory_limit to a size such as 600MB or 2GB (SET takes no bound parameter, so the size is
    validated here before it is formatted in)."""
    if not re.fullmatch(r"\d+(\.\d+)?\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)", size.strip()):
        raise UsageError(f"memory limit {size!r} is not a size like 600MB or 2GB")
    con.execute(f"SET memory_limit = '{size.strip()}'")
