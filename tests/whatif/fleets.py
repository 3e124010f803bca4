"""A bprof.synth.fleet run written into a fresh store and analysed as `bprof analyze` does: the
input of the what-if tests that check predictions against a simulated truth."""

from __future__ import annotations

from bprof.analyzers import run as analysis
from bprof.analyzers.base import Options
from bprof.store.db import open_store
from bprof.synth.fleet import Fleet, write_fleet


def analysed_fleet(tmp_path_factory, name: str, fleet: Fleet):
    """(con, truth) of `fleet` in tmp/<name>/s.duckdb, every analyzer run."""
    con = open_store(tmp_path_factory.mktemp(name) / "s.duckdb")
    truth = write_fleet(con, fleet)
    analysis.analyze_run(con, truth.run_id, Options())
    return con, truth
