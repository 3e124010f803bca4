"""A faulted program against the same program without the fault, both recorded for real: the
analysis and the no-stragglers what-if of each recording, the measured truth (the difference of
their step times), how long the fault really ran, and the invariants every answer must hold."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import duckdb

from tests.analyzers.recorded import record_script


def cli(*args) -> dict:
    """`bprof ARGS --json`, which must exit 0; its parsed output."""
    done = subprocess.run([sys.executable, "-m", "bprof.cli.main", *args, "--json"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@dataclass
class Recording:
    db: Path
    analysis: dict  # bprof analyze --json
    whatif: dict  # bprof whatif -s SCENARIO ... --json

    @property
    def step_ns(self) -> int:
        return self.analysis["metrics"]["step_time_ns"]["value"]

    @property
    def ranked(self) -> list[dict]:
        """The findings with a price, in bprof's order (largest lost_ns first)."""
        return [f for f in self.analysis["findings"] if f["lost_ns"] is not None]

    def scenario(self, name: str) -> dict:
        [found] = [s for s in self.whatif["scenarios"] if s["scenario"] == name]
        return found

    @property
    def unchanged(self) -> dict:
        return self.scenario("unchanged")

    @property
    def no_stragglers(self) -> dict:
        return self.scenario("no-stragglers")

    def fault_ns(self, rank: int, name: str) -> float:
        """The median over the analysed steps of the time `rank` spent in ranges named `name`: the fault
        as it really ran (load stretches it). bprof does not read these ranges."""
        con = duckdb.connect(str(self.db), read_only=True)
        try:
            per_step = con.execute("""SELECT sum(dur_ns) FROM events WHERE rank = ? AND name = ? AND step IS NOT NULL
                                      GROUP BY step""", [rank, name]).fetchall()
        finally:
            con.close()
        return statistics.median(ns for (ns,) in per_step)


def record(tmp_path: Path, name: str, program: Path, args: list[str], *, steps: str = "3:9",
           scenarios: tuple[str, ...] = ("no-stragglers",)) -> Recording:
    """Record `program ARGS` under `bprof record -- torchrun` on 2 CPU ranks, analyse it and run the
    what-if `scenarios` on it."""
    db = record_script(tmp_path, name, program, args, steps=steps)
    options = [arg for s in scenarios for arg in ("-s", s)]
    return Recording(db, cli("analyze", "--db", str(db)), cli("whatif", "--db", str(db), *options))


def summary(label: str, clean: Recording, faulted: Recording) -> str:
    top = faulted.ranked[0]
    predictions = ", ".join(f"{s['scenario']} predicts {s['predicted_step_ns'] / 1e6:.1f} ms"
                            for s in faulted.whatif["scenarios"] if s["scenario"] != "unchanged")
    return (f"{label}: clean {clean.step_ns / 1e6:.1f} ms, faulted {faulted.step_ns / 1e6:.1f} ms, "
            f"truth {(faulted.step_ns - clean.step_ns) / 1e6:.1f} ms; top {top['analyzer']} {top['evidence'].get('ranks')} "
            f"{top['lost_ns'] / 1e6:.1f} ms ({top['title']}); {predictions}")


def assert_invariants(rec: Recording) -> None:
    """No finding above the step of the ranks; the unchanged replay equals the measurement; every
    prediction is positive and not withheld."""
    steps = [r["median_step_ns"] for r in rec.analysis["ranks"]]
    assert all(f["lost_ns"] <= max(steps) for f in rec.ranked), [(f["title"], f["lost_ns"]) for f in rec.ranked]
    assert rec.unchanged["withheld"] is None and rec.unchanged["max_error_frac"] < 0.01, rec.unchanged
    for s in rec.whatif["scenarios"]:
        assert s["withheld"] is None and s["predicted_step_ns"] > 0, s
