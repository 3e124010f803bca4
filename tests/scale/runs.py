"""The synthetic run the scale tests reduce, and what they compare: a 4-rank tp2·dp2 NCCL run
with a slow rank (so stragglers and matched collectives have something to find), analysed from
its full traces as the reference every engine's reduced run must equal."""

from __future__ import annotations

from pathlib import Path

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.store.ingest import IngestOptions, ingest_paths
from bprof.store.reduce import TABLES
from bprof.synth import Fault, Scenario, write_run

NUM_RANKS = 4


def write_synthetic_run(out: Path) -> Path:
    write_run(Scenario(tp=2, pp=1, dp=2, steps=2, seed=5, faults=[Fault("slow_rank", rank=1, extra_ns=15_000_000)]), out)
    return out


def analysed(db: Path, ingest):
    """A store at `db` with one run ingested by `ingest(con)` (a list of IngestResult), analysed."""
    con = open_store(db)
    [result] = ingest(con)
    analysis.analyze_run(con, result.run_id, Options())
    return con, result


def full_reference(run: Path, db: Path):
    """The run ingested from its traces (no reduce) and analysed."""
    return analysed(db, lambda con: ingest_paths(con, [run], IngestOptions(name="full")))


def parquet_digests(outputs: list[Path]) -> dict[tuple[str, str], str]:
    """(rank folder, table) -> sha256 from each output's manifest: what the reduce wrote, wherever it ran."""
    import json

    digests = {}
    for out in outputs:
        manifest = json.loads((out / "manifest.json").read_text())
        digests |= {(out.name, t): manifest["tables"][t]["sha256"] for t in TABLES}
    return digests
