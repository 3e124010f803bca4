"""The CLI's tables at 80 columns: on a real 4-rank `bprof record` of the example trainer (the run
`make demo` records) and on a synthetic 8-GPU run, every command that prints a table is run with
COLUMNS=80 and COLUMNS=200. At 80 no line is wider than the terminal, no cell is cut ("expos…"),
and every number with its unit that --json reports appears whole on one line; at 200 the full table
(its box drawing) is printed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from bprof.dashboards.format import pct
from tests.cli.conftest import bprof_at

UNIT = r"(ms|us|µs|s|%|x|GB/s|MB|kB)"


def assert_fits(text: str, width: int, values: list[str]) -> None:
    """Nothing cut: no line past `width`, no ellipsis, no number split from its unit, each value whole."""
    lines = text.splitlines()
    assert lines
    for line in lines:
        assert len(line.rstrip()) <= width, line
        assert "…" not in line, line
    for above, below in zip(lines, lines[1:]):
        # a number ending one line and its unit starting the next: "292.87" / "ms"
        split = re.search(r"\d$", above.rstrip(" │┃")) and re.match(rf"[│┃ ]*{UNIT}\b", below)
        assert not split, f"number cut from its unit:\n{above}\n{below}"
    for value in values:
        assert any(value in line for line in lines), f"{value!r} not whole on one line:\n{text}"


def test_analyze_fits_80_columns_and_is_a_full_table_when_wide(demo_store):
    data = json.loads(bprof_at(80, "analyze", "--db", demo_store, "--json").stdout)
    values = [f"{r['median_step_ns'] / 1e6:.2f} ms" for r in data["ranks"]]
    values += [pct(r["exposed_comm_frac"]) for r in data["ranks"]]
    values += [f"{f['lost_ns'] / 1e6:.2f} ms" for f in data["findings"][:10] if f["lost_ns"] is not None]
    narrow = bprof_at(80, "analyze", "--db", demo_store).stdout
    assert_fits(narrow, 80, values)
    assert "exposed comm: " in narrow   # the breakdown, stacked
    wide = bprof_at(200, "analyze", "--db", demo_store).stdout
    assert_fits(wide, 200, values)
    assert "┃ rank ┃ step" in wide and "exposed comm ┃" in wide
    # --json is the same whatever the width
    assert json.loads(bprof_at(200, "analyze", "--db", demo_store, "--json").stdout)["ranks"] == data["ranks"]


def test_replay_info_runs_calibrate_fit_80_columns(demo_store):
    pytest.importorskip("torch")
    replayed = bprof_at(80, "replay", "--db", demo_store, "--top", "1", "--variant", "bf16", "--repeats", "3")
    rows = json.loads(bprof_at(80, "replay", "--db", demo_store, "--top", "1", "--dry-run", "--json").stdout)
    items = [r["item"] for r in rows if len(r["item"]) <= 70]
    assert items
    assert_fits(replayed.stdout, 80, items)   # items whole, never "aten::… 256x12…"
    info = json.loads(bprof_at(80, "info", "--db", demo_store, "--json").stdout)
    assert_fits(bprof_at(80, "info", "--db", demo_store).stdout, 80,
                [f"{r['num_events']:,}" for r in info["ranks"]])
    assert_fits(bprof_at(80, "runs", "--db", demo_store).stdout, 80, ["demo"])
    calibrated = bprof_at(80, "calibrate", "--db", demo_store, "--dtype", "fp32", "--repeats", "1")
    assert_fits(calibrated.stdout, 80, ["fp32"])


def test_synthetic_gpu_run_fits_80_columns(tmp_path):
    subprocess.run([sys.executable, "-m", "bprof.synth", str(tmp_path / "run"), "--tp", "2", "--pp", "2", "--dp", "2",
                    "--hosts", "2", "--slow-rank", "3"], check=True, capture_output=True, timeout=300)
    db = tmp_path / "s.duckdb"
    bprof_at(80, "ingest", tmp_path / "run", "--db", db, "--name", "syn")
    narrow = bprof_at(80, "analyze", "--db", db, "--top", "10").stdout
    data = json.loads(bprof_at(80, "analyze", "--db", db, "--json").stdout)
    assert_fits(narrow, 80, [f"{r['median_step_ns'] / 1e6:.2f} ms" for r in data["ranks"]]
                + [f"{f['lost_ns'] / 1e6:.2f} ms" for f in data["findings"][:10] if f["lost_ns"] is not None])
