"""The history keeps what a check needs, in the run's store or a separate file, once per run and series."""

from __future__ import annotations

import pytest

from bprof.ci.history import load_series, resolve_baseline, save
from bprof.errors import UsageError
from bprof.store.db import open_store
from tests.ci.samples import load

LOADED = load("loaded_machine")


def test_a_summary_comes_back_as_it_was_saved(tmp_path):
    con = open_store(tmp_path / "history.duckdb")
    try:
        original = LOADED["slow1"]
        history_id, created = save(con, original, "main", "bprof.duckdb")
        assert created
        assert save(con, original, "main", "bprof.duckdb") == (history_id, False)  # once per series
        [entry] = load_series(con, "main", "gpt-tiny")
        back = entry.summary
        assert (entry.history_id, entry.series) == (history_id, "main")
        assert back.metrics == original.metrics and back.components == original.components
        assert back.facts == original.facts and back.critical_rank == original.critical_rank == 1
        assert (back.run_name, back.fingerprint, back.benchmark) == ("slow1", original.fingerprint, "gpt-tiny")
        assert load_series(con, "main", None) == [] and load_series(con, "release", "gpt-tiny") == []
    finally:
        con.close()


def test_baseline_by_series_or_by_run(tmp_path):
    con = open_store(tmp_path / "history.duckdb")
    try:
        for i in range(1, 9):
            save(con, LOADED[f"base{i}"], "main", None)
        name, entries = resolve_baseline(con, "main", "gpt-tiny")
        assert (name, [e.summary.run_name for e in entries]) == ("main", [f"base{i}" for i in range(1, 9)])
        # a run of the history: its series up to and including that run
        name, entries = resolve_baseline(con, "base5", "gpt-tiny")
        assert (name, [e.summary.run_name for e in entries]) == ("main", [f"base{i}" for i in range(1, 6)])
        assert resolve_baseline(con, "main", "other-benchmark") == ("main", [])
        with pytest.raises(UsageError, match=r"no baseline series or run 'nightly' in the history \(series: main;"):
            resolve_baseline(con, "nightly", "gpt-tiny")
    finally:
        con.close()
