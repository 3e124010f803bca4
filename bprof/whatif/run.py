"""`whatif(con, run_id, scenarios)`: replay every analysed step of a run unchanged and under each
scenario, and store what each predicts (tables whatif and whatif_runs, schema.sql).

Per rank and step: predicted = replayed span end - span start; measured = the span. The job's
measured step is its longest rank's, and the run's step time the median over steps, as `bprof
analyze` defines it. The job's predicted step is the measured one less what the replay gains on the
job's window (latest span end - earliest span start): the gain the straggler pricing (bprof.whatif.peers)
and every finding's price count, so `bprof analyze` and `bprof whatif` cannot disagree. The two
differ where ranks' spans are offset (pipeline stages; a rank that started late because the
previous step ended late on it): a replay of one step keeps every rank's measured start, so a rank
that started late keeps its late start, and its longest span can shrink less than the job's end
moves earlier (measured on a synthetic 2-stage run: 0.60 ms by the longest span, 1.43 ms by the window,
1.21 ms truth). MFU scales with it: predicted MFU = the run's MFU x measured step / predicted step x the
scenario's work factor (1, but M/m for microbatches=M: the step's model FLOPs grow with it; per
GPU, with the same peaks).
"""

from __future__ import annotations

import dataclasses
import datetime

import duckdb
import numpy as np
import pyarrow as pa

from bprof.errors import DataError, UsageError
from bprof.whatif import graph
from bprof.whatif.engine import replay
from bprof.whatif.scenarios import Part, State, parse

UNCHANGED = "unchanged"
# The unchanged replay must reproduce every measured rank-step; beyond this (relative) error the
# graph does not describe the run, and no scenario's prediction is shown.
UNCHANGED_TOLERANCE_FRAC = 0.01


@dataclasses.dataclass
class ScenarioResult:
    scenario: str
    parts: list[Part]
    rank: list[np.ndarray] = dataclasses.field(default_factory=list)  # per step, per span rank
    step: list[int] = dataclasses.field(default_factory=list)
    predicted_ns: list[np.ndarray] = dataclasses.field(default_factory=list)
    measured_ns: list[np.ndarray] = dataclasses.field(default_factory=list)
    start_ns: list[np.ndarray] = dataclasses.field(default_factory=list)  # per step, per span rank: aligned span start

    def job_steps(self) -> tuple[list[int], list[int]]:
        """(measured, predicted) job step per step: the longest rank's span, and that less the
        replay's gain on the job's window (latest end - earliest start)."""
        measured, predicted = [], []
        for p, m, start in zip(self.predicted_ns, self.measured_ns, self.start_ns):
            if len(m):
                measured.append(int(m.max()))
                predicted.append(int(m.max() - ((m + start).max() - (p + start).max())))
        return measured, predicted

    def work_factor(self) -> float:
        """The model FLOPs of a predicted step over a measured one (more micro-batches do more work)."""
        return float(np.prod([p.work_factor() for p in self.parts])) if self.parts else 1.0

    def summary(self, mfu_frac: float | None) -> dict:
        measured, predicted = self.job_steps()
        meas = int(np.median(measured)) if measured else None
        pred = int(np.median(predicted)) if predicted else None
        err = np.concatenate([np.abs(p - m) / np.maximum(m, 1) for p, m in zip(self.predicted_ns, self.measured_ns)]) \
            if self.measured_ns else np.zeros(0)
        withheld = self.violation()
        if withheld:
            pred = None
        return {
            "scenario": self.scenario,
            "num_steps": len(measured),
            "num_ranks": int(max((len(r) for r in self.rank), default=0)),
            "measured_step_ns": meas,
            "predicted_step_ns": pred,
            "delta_frac": (pred - meas) / meas if meas and pred is not None else None,
            # what the scenario buys per step, as a finding's lost_ns counts it: the median over steps of
            # (measured - predicted) job step, which is not the difference of the two medians
            "saved_ns": int(np.median(np.subtract(measured, predicted))) if predicted and not withheld else None,
            "measured_mfu_frac": mfu_frac,
            "predicted_mfu_frac": mfu_frac * meas / pred * self.work_factor() if mfu_frac is not None and meas and pred else None,
            "max_error_frac": float(err.max()) if len(err) else None,
            "median_error_frac": float(np.median(err)) if len(err) else None,
            "assumptions": [p.assumption() for p in self.parts],
            "withheld": withheld,
        }

    def violation(self) -> str | None:
        """Why this scenario's prediction breaks a physical invariant, or None: every predicted
        rank-step must be positive (a step cannot end before it starts)."""
        bad = [(int(r[i]), s) for r, s, p in zip(self.rank, self.step, self.predicted_ns) for i in np.flatnonzero(p <= 0)]
        if not bad:
            # then every job step is positive too: the window's gain is at most what its last rank
            # gains, which is below that rank's measured span, at most the longest one
            return None
        shown = ", ".join(f"rank {r} step {s}" for r, s in bad[:5])
        return (f"the replay predicts a step of zero or less on {len(bad)} rank-steps ({shown}): the step graph "
                "does not model this run's dependencies there, so no prediction is given")


@dataclasses.dataclass
class WhatifResult:
    run_id: int
    results: list[ScenarioResult]
    summaries: list[dict]
    num_ranks_without_events: int


def whatif(con: duckdb.DuckDBPyConnection, run_id: int, scenarios: list[str], *, write: bool = True) -> WhatifResult:
    """Replay the run unchanged and under each scenario string (parts joined by '+'); store the
    rows when `write` (replacing earlier rows of the same run and scenario, in one transaction)."""
    parsed = [(text.strip(), parse(text)) for text in scenarios]  # usage errors before any work
    if not graph.has_analysis(con, run_id):
        raise UsageError(f"run {run_id} is not analysed: run `bprof analyze {run_id}` first")
    for _, parts in parsed:
        for p in parts:
            p.prepare(con, run_id)
    results = [ScenarioResult(UNCHANGED, [])] + [ScenarioResult(t, parts) for t, parts in parsed]
    without_events = 0
    for m in graph.steps(con, run_id):
        without_events = max(without_events, int((~m.has_events).sum()))
        start = m.g.span_start_ns
        for res in results:
            s = State.measured(m)
            for p in sorted(res.parts, key=lambda p: p.late):  # stable: the others in order, then the late ones
                p.apply(con, run_id, m, s)
            r = replay(m.g, s.work, s.tail, s.exit_after)
            res.rank.append(m.g.span_rank)
            res.step.append(m.step)
            res.predicted_ns.append(r.end_ns + s.end_delta - start)
            res.measured_ns.append(m.measured_ns)
            res.start_ns.append(start)
    mfu = _metric(con, run_id, "mfu_frac")
    summaries = [r.summary(mfu) for r in results]
    _check_unchanged(results[0], run_id)
    if without_events:
        for s in summaries[1:]:
            s["assumptions"].append(f"{without_events} ranks have no events (reduced): their work has no host gaps or "
                                    "kernel classes to change")
    out = WhatifResult(run_id, results, summaries, without_events)
    if write:
        _write(con, out)
    return out


def saved_ns(con: duckdb.DuckDBPyConnection, run_id: int, scenarios: list[str]) -> tuple[dict[str, int], str]:
    """What each scenario saves (its summary's saved_ns), replayed together and written nowhere: how
    the analyzers price their findings with the one engine. Scenarios whose prediction is withheld
    are left out; with none priced, the reason (no step graph, an unchanged replay off the measurement)."""
    if not scenarios:
        return {}, ""
    if not graph.has_analysis(con, run_id):
        return {}, "the run has no matched step graph to replay"
    try:
        out = whatif(con, run_id, scenarios, write=False)
    except DataError as e:
        return {}, str(e)
    saved = {s["scenario"]: s["saved_ns"] for s in out.summaries[1:] if s["saved_ns"] is not None}
    return saved, "the replay withheld its prediction" if len(saved) < len(scenarios) else ""


def _check_unchanged(base: ScenarioResult, run_id: int) -> None:
    """DataError (exit 3, no predictions) when the unchanged replay misses a measured rank-step by
    more than UNCHANGED_TOLERANCE_FRAC, naming the worst rank-steps."""
    off = [(abs(int(p) - int(m)) / max(int(m), 1), int(r), s, int(p), int(m))
           for rr, s, pp, mm in zip(base.rank, base.step, base.predicted_ns, base.measured_ns)
           for r, p, m in zip(rr, pp, mm)]
    bad = sorted((o for o in off if o[0] > UNCHANGED_TOLERANCE_FRAC), reverse=True)
    if bad:
        shown = "; ".join(f"rank {r} step {s}: replayed {p / 1e6:.2f} ms, measured {m / 1e6:.2f} ms" for _, r, s, p, m in bad[:3])
        raise DataError(f"run {run_id}: the unchanged replay is off the measurement by more than "
                        f"{UNCHANGED_TOLERANCE_FRAC:.0%} on {len(bad)} rank-steps ({shown}); no prediction is given")


def _metric(con, run_id: int, name: str) -> float | None:
    row = con.execute("SELECT value FROM metrics WHERE run_id = ? AND name = ?", [run_id, name]).fetchone()
    return row[0] if row else None


def _write(con: duckdb.DuckDBPyConnection, out: WhatifResult) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    con.execute("BEGIN TRANSACTION")
    try:
        for res, summary in zip(out.results, out.summaries):
            con.execute("DELETE FROM whatif WHERE run_id = ? AND scenario = ?", [out.run_id, res.scenario])
            con.execute("DELETE FROM whatif_runs WHERE run_id = ? AND scenario = ?", [out.run_id, res.scenario])
            if res.rank:
                sizes = [len(r) for r in res.rank]
                table = pa.table({
                    "rank": pa.array(np.concatenate(res.rank).astype(np.int32)),
                    "step": pa.array(np.repeat(np.asarray(res.step, dtype=np.int32), sizes)),
                    "predicted_ns": pa.array(np.concatenate(res.predicted_ns).astype(np.int64)),
                    "measured_ns": pa.array(np.concatenate(res.measured_ns).astype(np.int64))})
                con.register("_wi_rows", table)
                try:
                    con.execute("INSERT INTO whatif SELECT ?, ?, rank, step, predicted_ns, measured_ns FROM _wi_rows",
                                [out.run_id, res.scenario])
                finally:
                    con.unregister("_wi_rows")
            con.execute("""INSERT INTO whatif_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                        [out.run_id, res.scenario, now, summary["num_steps"], summary["num_ranks"],
                         summary["measured_step_ns"], summary["predicted_step_ns"], summary["delta_frac"],
                         summary["measured_mfu_frac"], summary["predicted_mfu_frac"], summary["max_error_frac"],
                         summary["median_error_frac"], summary["assumptions"]])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise
