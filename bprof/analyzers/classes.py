"""The kernel catalogue as a temp table (_classes) that analyzers' SQL joins on (name, kind).

Classification runs in Python over DISTINCT (name, kind) pairs: a run has millions of events but
only hundreds of distinct names, so the regex catalogue stays in one place (bprof.kernels).
"""

from __future__ import annotations

import duckdb
import pandas as pd

from bprof.kernels.classify import classify_many

CLASSIFIED_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "cpu_op", "user_annotation")


def load_classes(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """(Re)create temp table _classes(name, kind, fine_class, coarse_class, rule_id) for the run."""
    pairs = con.execute(
        "SELECT DISTINCT name, kind FROM events WHERE run_id = ? AND kind IN (SELECT unnest(?)) AND name IS NOT NULL",
        [run_id, list(CLASSIFIED_KINDS)]).fetchall()
    rows = classify_many(pairs)
    frame = pd.DataFrame(rows, columns=["name", "kind", "fine_class", "coarse_class", "rule_id"])
    con.register("_classes_frame", frame)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE _classes AS SELECT * FROM _classes_frame")
    finally:
        con.unregister("_classes_frame")
