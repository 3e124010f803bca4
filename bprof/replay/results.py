"""Replay results: verdicts, the isolation classification, the replays table and the replay findings.

Torch-free, so that reading and reporting replays needs no torch.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field

import duckdb
import scipy.stats

from bprof.replay.plan import spread_of

FASTER, NOISE, SLOWER = "faster", "no better than noise", "slower"
IN_ISOLATION = "slow in isolation"
IN_CONTEXT = "fast in isolation, slow in the trace"
NOT_REPRODUCED = "slower in isolation than in the trace"
# traced / replayed beyond this factor (and beyond both spreads) is a context problem; on this
# factor's other side the replay is slower than the trace: conditions differ (threads, device)
CONTEXT_FACTOR = 1.5
SIGN_ALPHA = 0.05  # a verdict's pairs must be this unlikely for a coin (two-sided sign test)
MIN_EFFECT = 1.05  # and its median paired speedup beyond 5 % either way


@dataclass
class ReplayResult:
    """One replayed item and variant; times are per call (op, collective) or per loop / step (loops, storms)."""

    item_kind: str
    item: str
    item_key: str
    rank: int
    variant: str                          # baseline, bf16, pad8, pad64, pad128, contiguous, bmm, bucket, msg4x, split4
    status: str                           # replayed, not_rebuildable, not_applicable, failed
    device: str
    reason: str | None = None
    shapes: list | None = None
    dtypes: list | None = None
    strides: list | None = None
    num_threads: int | None = None
    num_repeats: int = 0
    calls_per_step: float | None = None
    traced_ns: int | None = None
    traced_spread_frac: float | None = None
    traced_basis: str | None = None
    replayed_ns: int | None = None
    replayed_spread_frac: float | None = None
    replayed_samples_ns: list[int] = field(default_factory=list)
    baseline_ns: int | None = None
    speedup: float | None = None
    verdict: str | None = None
    classification: str | None = None
    group_size: int | None = None
    replayed_group_size: int | None = None
    bytes: int | None = None
    busbw_bytes_per_s: float | None = None
    finding_id: int | None = None
    finding_title: str | None = None
    together: int = 1                     # processes that ran the item at once (ops, chains; collectives: 1)

    def record(self) -> dict:
        out = asdict(self)
        out.pop("replayed_samples_ns")
        return out


def samples_result(base: ReplayResult, samples_s: list[float]) -> ReplayResult:
    """`base` with the timed samples (seconds per call) filled in."""
    ns = [int(round(s * 1e9)) for s in samples_s]
    base.replayed_samples_ns = ns
    base.replayed_ns = int(statistics.median(ns))
    base.replayed_spread_frac = spread_of(ns)
    base.num_repeats = len(ns)
    base.status = "replayed"
    return base


def judge(variant: list[float], baseline: list[float]) -> tuple[float, str]:
    """(speedup = baseline median / variant median, verdict). Repeat i of the variant and of the
    baseline ran back to back (interleaved), so they met the same load: a pair is one fair comparison.
    Faster (slower) when the variant won (lost) in so many pairs that a coin would do so with
    probability at most SIGN_ALPHA (exact two-sided sign test: 7 of 7, 8 of 9, 9 of 10 ...) and the
    median paired speedup is beyond MIN_EFFECT; anything less is noise. Unpaired samples (different
    counts) need every repeat of one to beat every repeat of the other."""
    speedup = statistics.median(baseline) / statistics.median(variant)
    if len(variant) != len(baseline):
        if max(variant) < min(baseline):
            return speedup, FASTER
        if min(variant) > max(baseline):
            return speedup, SLOWER
        return speedup, NOISE
    ratios = [b / v for b, v in zip(baseline, variant) if v > 0 and b > 0]
    wins, losses = sum(r > 1 for r in ratios), sum(r < 1 for r in ratios)
    if not ratios or sign_test_p(max(wins, losses), wins + losses) > SIGN_ALPHA:
        return speedup, NOISE
    paired = statistics.median(ratios)
    if wins > losses and paired >= MIN_EFFECT:
        return speedup, FASTER
    if losses > wins and paired <= 1 / MIN_EFFECT:
        return speedup, SLOWER
    return speedup, NOISE


def sign_test_p(k: int, n: int) -> float:
    """Two-sided exact sign test (scipy.stats.binomtest against p = 1/2): the probability that a fair
    coin lands the same side k or more times of n, doubled, at most 1; 1 for no pairs."""
    if n == 0:
        return 1.0
    return float(scipy.stats.binomtest(k, n, 0.5).pvalue)


def pairs_to_decide() -> int:
    """The fewest repeat pairs with which the sign test can decide at all (every pair one way at
    SIGN_ALPHA): 6 at 5 %. With fewer, 'no better than noise' says nothing about the variant."""
    n = 1
    while sign_test_p(n, n) > SIGN_ALPHA:
        n += 1
    return n


def verdict_text(verdict: str | None, num_repeats: int) -> str | None:
    """The verdict as a reader should take it: from fewer pairs than the sign test needs, it says
    that nothing was decided and how many repeats would decide, instead of 'no better than noise'."""
    need = pairs_to_decide()
    if verdict == NOISE and num_repeats < need:
        return f"{num_repeats} pairs: too few to decide, {need} needed; rerun with --repeats {need}"
    return verdict


def classify(traced_ns: list[int], replayed_ns: list[int]) -> str:
    """Whether the traced time is the op's own (slow in isolation) or the context's."""
    traced, replayed = statistics.median(traced_ns), statistics.median(replayed_ns)
    if traced > CONTEXT_FACTOR * replayed and statistics.median(traced_ns) > max(replayed_ns):
        return IN_CONTEXT
    if replayed > CONTEXT_FACTOR * traced and min(replayed_ns) > statistics.median(traced_ns):
        return NOT_REPRODUCED
    return IN_ISOLATION


def save(con: duckdb.DuckDBPyConnection, run_id: int, results: list[ReplayResult]) -> None:
    """Store the results (replacing earlier replays of the same item, variant and device) and write one
    `replay` finding per replayed baseline item, replacing the run's earlier replay findings of it."""
    con.execute("BEGIN TRANSACTION")
    try:
        for r in results:
            con.execute("DELETE FROM replays WHERE run_id = ? AND item_key = ? AND variant = ? AND device = ?",
                        [run_id, r.item_key, r.variant, r.device])
            con.execute("""
                INSERT INTO replays (run_id, replayed_at, item_kind, item, item_key, rank, variant, status, reason, device,
                    shapes, dtypes, strides, num_threads, num_repeats, calls_per_step, traced_ns, traced_spread_frac,
                    traced_basis, replayed_ns, replayed_spread_frac, baseline_ns, speedup, verdict, classification,
                    group_size, replayed_group_size, bytes, busbw_bytes_per_s, finding_id, finding_title, together)
                VALUES (?, now(), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                        [run_id, r.item_kind, r.item, r.item_key, r.rank, r.variant, r.status, r.reason, r.device,
                         _json(r.shapes), _json(r.dtypes), _json(r.strides), r.num_threads, r.num_repeats, r.calls_per_step,
                         r.traced_ns, r.traced_spread_frac, r.traced_basis, r.replayed_ns, r.replayed_spread_frac,
                         r.baseline_ns, r.speedup, r.verdict, r.classification, r.group_size, r.replayed_group_size,
                         r.bytes, r.busbw_bytes_per_s, r.finding_id, r.finding_title, r.together])
        for base in (r for r in results if r.variant == "baseline" and r.status == "replayed"):
            _write_finding(con, run_id, base, [r for r in results if r.item_key == base.item_key and r.variant != "baseline"])
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


def _write_finding(con, run_id: int, base: ReplayResult, variants: list[ReplayResult]) -> None:
    """The classification as a finding. lost_ns: for a context problem, (traced - replayed) x calls per
    step; for an op slow in isolation, what its best verified-faster variant saves per step; else none."""
    con.execute("DELETE FROM findings WHERE run_id = ? AND analyzer = 'replay' AND json_extract_string(evidence, '$.item_key') = ?",
                [run_id, base.item_key])
    per_step = base.calls_per_step or 1.0
    faster = sorted((v for v in variants if v.verdict == FASTER), key=lambda v: v.replayed_ns)
    checked = ", ".join(f"{v.variant} {verdict_text(v.verdict, v.num_repeats)} ({v.speedup:.2f}x)" for v in variants if v.verdict)
    times = f"replayed {_ms(base.replayed_ns)} vs traced {_ms(base.traced_ns)}"
    if base.classification == IN_CONTEXT:
        lost = int((base.traced_ns - base.replayed_ns) * per_step)
        title = f"{base.item}: fast in isolation, slow in the trace ({times})"
        detail = (f"Look at the context (contention with other ranks or threads, a straggler, overlap interference), not the kernel.\n"
                  f"Counterfactual: its {per_step:g} calls per step as fast as in isolation.")
    else:
        best = faster[0] if faster and base.classification == IN_ISOLATION else None
        lost = int((base.replayed_ns - best.replayed_ns) * per_step) if best else None
        title = f"{base.item}: {base.classification} ({times})" + (f"; {best.variant} verified {best.speedup:.2f}x faster" if best else "")
        detail = ((f"Apply the {best.variant} fix; replay measured it faster beyond the spread of the repeats.\n"
                   f"Counterfactual: its {per_step:g} calls per step at the {best.variant} variant's replayed time.") if best else
                  ("No variant replay checked was faster beyond noise; no gain is claimed." if all(
                      v.num_repeats >= pairs_to_decide() for v in variants if v.verdict) else
                   "Too few repeats to decide whether a variant is faster; no gain is claimed."))
    if checked:
        detail += f" Variants: {checked}."
    evidence = {"advice": detail.splitlines()[0], "ranks": [base.rank], "item_key": base.item_key, "item": base.item,
                "classification": base.classification, "verifies_finding_id": base.finding_id,
                "variants": {v.variant: v.verdict for v in variants if v.verdict}}
    con.execute("INSERT INTO findings (run_id, analyzer, severity, lost_ns, title, detail, evidence) VALUES (?, 'replay', 'info', ?, ?, ?, ?)",
                [run_id, lost, title, detail, json.dumps(evidence)])


def _json(value):
    return None if value is None else json.dumps(value)


def _ms(ns: int | None) -> str:
    if ns is None:
        return "?"
    return f"{ns / 1e6:.3f} ms" if ns >= 100_000 else f"{ns / 1e3:.1f} us"
