"""A partial run replaced by the complete one: `bprof reduce/ingest --engine` ingests the outputs that
were made when a trace failed (a partial run); once the rerun has them all, the complete run is
ingested from a superset of the same files and the partial one is removed in the same transaction,
its name passing to the complete run (unless --name gave another)."""

from __future__ import annotations

from dataclasses import dataclass

import duckdb


@dataclass(frozen=True)
class Replaced:
    run_id: int
    name: str
    num_ranks: int
    world_size: int


def superseded_partials(con: duckdb.DuckDBPyConnection, run_id: int) -> list[Replaced]:
    """The partial runs (missing ranks) of the same world size whose every file is one of run_id's,
    when run_id itself is complete; [] otherwise."""
    rows = con.execute("""
        WITH new AS (SELECT string_split(source_path, ';') AS files, world_size FROM runs
                     WHERE run_id = $run_id AND coalesce(len(missing_ranks), 0) = 0 AND world_size IS NOT NULL)
        SELECT r.run_id, r.name, r.num_ranks_ingested, r.world_size
        FROM runs r, new
        WHERE r.run_id <> $run_id AND len(r.missing_ranks) > 0 AND r.world_size = new.world_size
          AND list_has_all(new.files, string_split(r.source_path, ';'))
        ORDER BY r.run_id""", {"run_id": run_id}).fetchall()
    return [Replaced(*row) for row in rows]


def delete_run(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Every row of the run, in every table with a run_id column (the caller holds the transaction)."""
    tables = [t for (t,) in con.execute("""
        SELECT DISTINCT table_name FROM information_schema.columns
        WHERE column_name = 'run_id' AND table_schema = 'main' AND table_name <> 'runs'
          AND table_name IN (SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE')
        ORDER BY table_name""").fetchall()]
    for table in tables:
        con.execute(f'DELETE FROM "{table}" WHERE run_id = ?', [run_id])  # names from the catalog, not input
    con.execute("DELETE FROM runs WHERE run_id = ?", [run_id])


def replace_partials(con: duckdb.DuckDBPyConnection, run_id: int, name: str, keep_name: bool) -> tuple[str, list[str]]:
    """Remove the partial runs that run_id completes; returns run_id's name (the first replaced run's,
    unless keep_name) and one warning line per replaced run."""
    replaced = superseded_partials(con, run_id)
    for old in replaced:
        delete_run(con, old.run_id)
    if replaced and not keep_name:
        name = replaced[0].name
        con.execute("UPDATE runs SET name = ? WHERE run_id = ?", [name, run_id])
    return name, [f"replaced the partial run {old.name!r} (run {old.run_id}, {old.num_ranks} of {old.world_size} "
                  f"ranks) ingested from some of these files" for old in replaced]
