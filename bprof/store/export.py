"""Export a run as hive-partitioned Parquet datasets that DuckDB, Spark or Trino read.

Layout: DIR/<table>/run=<id>/[rank=<r>/]*.parquet for events, collectives, steps and ranks, so
`read_parquet('DIR/events/**/*.parquet', hive_partitioning = true)` sees every run and rank.
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from bprof.errors import UsageError

# table -> (partition columns, JSON columns written as text)
_TABLES = {
    "events": (("run", "rank"), ("args",)),
    "collectives": (("run", "rank"), ()),
    "steps": (("run",), ()),
    "ranks": (("run",), ("distributed_info", "device_properties")),
}


def export_parquet(con: duckdb.DuckDBPyConnection, run_id: int, out_dir: Path) -> dict[str, int]:
    """Write every table's rows of `run_id` under out_dir; returns rows written per table.

    Refuses to overwrite a run already exported there.
    """
    out_dir = Path(out_dir)
    for table in _TABLES:
        if (out_dir / table / f"run={run_id}").exists():
            raise UsageError(f"{out_dir / table / f'run={run_id}'} already exists; remove it or pick another directory")
    counts = {}
    for table, (partitions, json_columns) in _TABLES.items():
        target = out_dir / table
        target.mkdir(parents=True, exist_ok=True)
        casts = ", ".join(f"CAST({c} AS VARCHAR) AS {c}" for c in json_columns)
        columns = f"* EXCLUDE (run_id{''.join(', ' + c for c in json_columns)}), run_id AS run" + (f", {casts}" if casts else "")
        # COPY takes no bound path; the path is quoted here and the run id stays a parameter.
        path = str(target).replace("'", "''")
        con.execute(
            f"COPY (SELECT {columns} FROM {table} WHERE run_id = ?) TO '{path}' "
            f"(FORMAT parquet, PARTITION_BY ({', '.join(partitions)}), COMPRESSION zstd, OVERWRITE_OR_IGNORE)",
            [run_id],
        )
        counts[table] = con.execute(f"SELECT count(*) FROM {table} WHERE run_id = ?", [run_id]).fetchone()[0]
    return counts
