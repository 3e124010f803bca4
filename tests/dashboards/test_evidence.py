"""A finding's evidence as the report shows it: ranks, steps and the backing numbers with units."""

from __future__ import annotations

import json

from bprof.dashboards import evidence


def test_ranks_steps_and_numbers_with_units():
    found = {"advice": "Overlap it.", "ranks": [1], "steps": [3, 4, 5], "dim": "tp", "exposed_recoverable_ns": 68555880}
    assert evidence.summary(found) == "rank 1; steps 3-5; dim tp; exposed recoverable 68.56 ms"
    assert json.loads(evidence.raw(found)) == {"ranks": [1], "steps": [3, 4, 5], "dim": "tp", "exposed_recoverable_ns": 68555880}


def test_timestamps_lists_and_long_text_stay_in_the_raw_evidence():
    found = {"ranks": [0, 1, 2, 3, 7], "gap_start_ts_ns": 1_733_000_000_000_000_000, "stall_ns": 1_733_000_000_000_000_000,
             "per_step_ns": list(range(60)), "item_key": "x" * 100, "names": ["a"] * 20, "share_frac": 0.0049,
             "in_bytes": 12_115_968, "finding_id": 27, "peak_flops_per_s": 4.3e10}
    assert evidence.summary(found) == "ranks 0-3, 7; share 0.49%; in 12.1 MB; peak 43 GFLOP/s"


def test_many_ranks_are_counted_not_listed():
    assert evidence.spans(list(range(0, 40, 2)), most=3) == "0, 2, 4 (+17 more)"
    assert evidence.summary({}) == ""
