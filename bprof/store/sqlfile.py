"""Run a package SQL file statement by statement, binding only the parameters each statement uses."""

from __future__ import annotations

from importlib import resources

import duckdb


def run_sql_file(con: duckdb.DuckDBPyConnection, package: str, filename: str, params: dict | None = None) -> None:
    """Execute `package/filename`; `$name` placeholders are bound from `params`, never formatted in."""
    sql = resources.files(package).joinpath(filename).read_text()
    bound = dict(params or {})
    for statement in statements(sql):
        used = {k: v for k, v in bound.items() if f"${k}" in statement}
        con.execute(statement, used or None)


def statements(sql: str) -> list[str]:
    """Split a SQL file on statement-ending semicolons (none of ours sit inside strings)."""
    lines = [ln for ln in sql.splitlines() if not ln.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";\n") if s.strip().rstrip(";").strip()]
