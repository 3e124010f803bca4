"""Measured device peaks (table device_peaks): written by `bprof calibrate`, read as MFU/HFU denominators.

No torch here: the measurement lives in bprof.replay.calibrate; this module only stores and reads it.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields
from datetime import datetime

import duckdb


@dataclass(frozen=True)
class MeasuredPeak:
    """One row of device_peaks; the columns are documented in schema.sql."""

    host: str
    device_kind: str
    device_name: str
    dtype: str
    num_threads: int
    flops_per_s: float | None
    flops_per_s_spread_frac: float | None
    mem_bytes_per_s: float | None
    matmul_size: int
    num_repeats: int
    measured_at: datetime
    torch_version: str | None


_COLUMNS = ", ".join(f.name for f in fields(MeasuredPeak))


def save_peaks(con: duckdb.DuckDBPyConnection, peaks: list[MeasuredPeak]) -> None:
    """Store `peaks` in one transaction; a row with the same key (a re-calibration) is replaced."""
    placeholders = ", ".join("?" for _ in fields(MeasuredPeak))
    con.execute("BEGIN TRANSACTION")
    try:
        for peak in peaks:
            con.execute(f"INSERT OR REPLACE INTO device_peaks ({_COLUMNS}) VALUES ({placeholders})", list(astuple(peak)))
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def load_peaks(con: duckdb.DuckDBPyConnection, *, host: str | None = None,
               device_kind: str | None = None) -> list[MeasuredPeak]:
    """All stored peaks, or those of one host and/or device kind, in key order."""
    rows = con.execute(f"""
        SELECT {_COLUMNS} FROM device_peaks
        WHERE (host = $host OR $host IS NULL) AND (device_kind = $kind OR $kind IS NULL)
        ORDER BY host, device_kind, device_name, dtype, num_threads""",
                       {"host": host, "kind": device_kind}).fetchall()
    return [MeasuredPeak(*row) for row in rows]


def cpu_peak_for_host(con: duckdb.DuckDBPyConnection, host: str, dtype: str) -> MeasuredPeak | None:
    """The CPU peak of the whole machine: the row of `host` and `dtype` with the most threads, or None.

    Among rows of equal thread count (a host whose CPU model name changed), the latest wins.
    """
    row = con.execute(f"""
        SELECT {_COLUMNS} FROM device_peaks
        WHERE host = ? AND device_kind = 'cpu' AND dtype = ?
        ORDER BY num_threads DESC, measured_at DESC LIMIT 1""", [host, dtype]).fetchone()
    return MeasuredPeak(*row) if row else None
