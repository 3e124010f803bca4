"""Verdicts that must not read as contradictions: a replay of too few repeats says it decided
nothing and how many would decide; the fp32 finding compares with a lower precision only where that
precision was measured (or has a datasheet peak)."""

from __future__ import annotations

import json
import shutil

import pytest

from bprof.replay.results import NOISE, judge, pairs_to_decide
from tests.cli.conftest import bprof_at


def test_pairs_to_decide_is_the_fewest_the_sign_test_can_decide_with():
    need = pairs_to_decide()
    assert need == 6   # 2 / 2**6 = 0.031 <= 0.05 < 2 / 2**5
    assert judge([1.0] * need, [2.0] * need)[1] == "faster"
    assert judge([1.0] * (need - 1), [2.0] * (need - 1))[1] == NOISE


def fp32_finding(db) -> dict:
    data = json.loads(bprof_at(200, "analyze", "--db", db, "--json").stdout)
    return next(f for f in data["findings"] if f["title"].startswith("fp32 matmuls"))


def test_no_precision_advice_without_a_measurement(demo_store, tmp_path):
    db = tmp_path / "s.duckdb"
    shutil.copy(demo_store, db)
    only_fp32 = fp32_finding(db)   # calibrated at fp32 only
    assert "would not be faster" not in only_fp32["advice"] and "Keep fp32" not in only_fp32["advice"]
    assert only_fp32["advice"].startswith("Not measured whether bf16 would be faster")
    pytest.importorskip("torch")
    peaks = json.loads(bprof_at(200, "calibrate", "--db", db, "--dtype", "bf16", "--repeats", "3", "--json").stdout)
    bf16 = next(p for p in peaks if p["dtype"] == "bf16")
    measured = fp32_finding(db)
    if measured["title"].endswith("could run in bf16"):
        assert measured["lost_ns"] > 0
    else:   # bf16 measured no faster here: said with both measured peaks, each the rank's share of its host's
        from bprof.store.db import open_store

        con = open_store(db, read_only=True)
        try:
            [(share,)] = con.execute("""SELECT count(*) FROM ranks WHERE run_id = (SELECT max(run_id) FROM runs)
                                        AND host = (SELECT host FROM ranks WHERE run_id = (SELECT max(run_id) FROM runs)
                                                    AND rank = ?)""", [measured["evidence"]["ranks"][0]]).fetchall()
        finally:
            con.close()
        assert measured["advice"].startswith("Keep fp32 here")
        assert f"bf16 {bf16['flops_per_s'] / share / 1e9:,.1f}" in measured["advice"]
        assert measured["evidence"]["bf16_flops_per_s"] == pytest.approx(bf16["flops_per_s"] / share)


def test_three_repeats_say_too_few_to_decide(demo_store, tmp_path):
    pytest.importorskip("torch")
    db = tmp_path / "s.duckdb"
    shutil.copy(demo_store, db)
    shown = bprof_at(200, "replay", "--db", db, "--top", "1", "--op", "aten::mm", "--variant", "bf16", "--repeats", "3").stdout
    assert "3 pairs: too few to decide, 6 needed; rerun with --repeats 6" in shown
    assert "no better than noise" not in shown
    rows = json.loads(bprof_at(200, "replay", "--db", db, "--top", "1", "--op", "aten::mm", "--variant", "bf16",
                               "--repeats", "3", "--json").stdout)
    assert [r["verdict"] for r in rows if r["variant"] == "bf16"] == [NOISE]   # --json keeps the verdict as stored
    data = json.loads(bprof_at(200, "analyze", "--db", db, "--json").stdout)
    replayed = [f for f in data["findings"] if f["analyzer"] == "replay" if "aten::mm" in f["title"]]
    assert replayed and "too few to decide" in replayed[0]["advice"] + replayed[0]["evidence"].get("advice", "")
