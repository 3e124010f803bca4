"""Is a candidate run a regression against a baseline series? One run is one draw: its robust summary
is tested against the prediction band of the baseline runs' summaries (bprof.ci.stats), in log space
(noise on step time is relative), and a regression needs both: outside the band at the requested
confidence, and a change larger than the threshold. Improvements are judged the same way.

Works on RunSummary values only (bprof.ci.summary), so it is tested on stored samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from bprof.ci.causes import Explanation, explain
from bprof.ci.history import Entry
from bprof.ci.stats import prediction_band
from bprof.ci.summary import METRICS, RunSummary, comparability, unknown_facts
from bprof.errors import DataError

MIN_BASELINE_RUNS = 5
DEFAULT_BASELINE_RUNS = 10


class NotEnoughData(DataError):
    """Too few baseline runs, a metric that is not measurable, or runs that are not comparable (exit 3)."""


@dataclass(frozen=True)
class CheckOptions:
    metrics: tuple[str, ...] = ("step_time", "mfu")  # keys of summary.METRICS
    threshold_frac: float = 0.03  # a change must be larger than this to count
    confidence: float = 0.99  # two-sided prediction band
    num_baseline_runs: int = DEFAULT_BASELINE_RUNS  # the last N comparable runs of the series
    min_baseline_runs: int = MIN_BASELINE_RUNS


@dataclass
class MetricVerdict:
    metric: str  # CLI name (step_time, mfu)
    store_name: str  # step_time_ns, mfu_frac
    unit: str
    better: str  # "lower" or "higher"
    candidate: float
    baseline_center: float  # geometric mean of the baseline runs' summaries
    band_low: float
    band_high: float
    change_frac: float  # candidate / baseline_center - 1
    t_score: float
    p_value: float  # two-sided, of a baseline-like run lying this far out
    outside_band: bool
    above_threshold: bool
    verdict: str  # regression, improvement or pass
    reason: str
    baseline_values: list[float]
    candidate_excluded_steps: list[int]
    candidate_num_steps: int
    candidate_step_spread_frac: float | None


@dataclass
class CheckResult:
    status: str  # regression or pass
    candidate: RunSummary
    series: str
    baseline: list[RunSummary]
    skipped_not_comparable: list[str]  # '<run>: <difference>' of series runs left out
    unknown_facts: list[str]
    options: CheckOptions
    verdicts: list[MetricVerdict] = field(default_factory=list)
    explanation: Explanation | None = None

    @property
    def regressions(self) -> list[MetricVerdict]:
        return [v for v in self.verdicts if v.verdict == "regression"]


def check(candidate: RunSummary, series: list[Entry], options: CheckOptions = CheckOptions(),
          series_name: str | None = None) -> CheckResult:
    """Compare `candidate` with the last comparable runs of `series` (oldest first); NotEnoughData when
    the answer cannot be trusted."""
    for m in options.metrics:
        if m not in METRICS:
            raise ValueError(f"unknown metric {m!r}")
    with_mfu = "mfu" in options.metrics
    series_name = series_name or (series[-1].series if series else "?")
    comparable, skipped = [], []
    for entry in series:
        s = entry.summary
        if s.fingerprint == candidate.fingerprint:
            continue  # a run is never its own baseline
        differences = comparability(candidate.facts, s.facts, with_mfu)
        if s.benchmark != candidate.benchmark:
            differences.insert(0, f"benchmark {candidate.benchmark} (candidate) vs {s.benchmark} (baseline)")
        if differences:
            skipped.append((s.run_name, differences))
        else:
            comparable.append(s)
    baseline = comparable[-options.num_baseline_runs:]
    if len(baseline) < options.min_baseline_runs:
        if skipped:
            name, differences = skipped[-1]
            raise NotEnoughData(f"not comparable: run {candidate.run_name!r} differs from baseline run {name!r} of "
                                f"series {series_name!r}: {'; '.join(differences)} ({len(baseline)} comparable "
                                f"baseline runs, need {options.min_baseline_runs})")
        raise NotEnoughData(f"not enough data: {len(baseline)} baseline runs in series {series_name!r}"
                            f"{_of_benchmark(candidate)}, need {options.min_baseline_runs} "
                            f"(add runs with `bprof ci record RUN --branch {series_name}`)")
    result = CheckResult("pass", candidate, series_name, baseline,
                         [f"{n}: {'; '.join(d)}" for n, d in skipped],
                         unknown_facts(candidate.facts, baseline[-1].facts), options)
    for metric in options.metrics:
        result.verdicts.append(_judge(metric, candidate, baseline, options))
    if result.regressions:
        result.status = "regression"
    worse_is_longer = not any(v.verdict == "improvement" for v in result.verdicts) or bool(result.regressions)
    result.explanation = explain(candidate, baseline, worse_is_longer)
    return result


def _judge(metric: str, candidate: RunSummary, baseline: list[RunSummary], options: CheckOptions) -> MetricVerdict:
    store_name, unit, better = METRICS[metric]
    mine = candidate.metrics.get(store_name)
    if mine is None or mine.value is None or mine.value <= 0:
        why = mine.not_measurable if mine else "not in its summary"
        raise NotEnoughData(f"not enough data: {metric} of run {candidate.run_name!r} is not measurable: {why}")
    values = [b.metrics[store_name].value for b in baseline
              if store_name in b.metrics and b.metrics[store_name].value and b.metrics[store_name].value > 0]
    if len(values) < options.min_baseline_runs:
        missing = next((b.metrics[store_name].not_measurable for b in baseline
                        if store_name in b.metrics and b.metrics[store_name].value is None), None)
        raise NotEnoughData(f"not enough data: {len(values)} of the {len(baseline)} baseline runs measured {metric}, "
                            f"need {options.min_baseline_runs}" + (f" ({missing})" if missing else ""))
    band = prediction_band([math.log(v) for v in values], options.confidence)
    x = math.log(mine.value)
    center = math.exp(band.center)
    change = mine.value / center - 1.0
    outside = band.outside(x)
    above = abs(change) > options.threshold_frac
    worse = change > 0 if better == "lower" else change < 0
    if outside and above:
        verdict = "regression" if worse else "improvement"
        reason = (f"{'worse' if worse else 'better'} by {abs(change):.1%}: outside the {options.confidence:.0%} "
                  f"band of {len(values)} baseline runs and above the {options.threshold_frac:.1%} threshold")
    elif outside:
        verdict = "pass"
        reason = (f"{change:+.1%} is outside the {options.confidence:.0%} band but within the "
                  f"{options.threshold_frac:.1%} threshold")
    elif above:
        verdict = "pass"
        reason = (f"{change:+.1%} is within the baseline's noise (the {options.confidence:.0%} band spans "
                  f"{math.exp(band.center - band.half_width) / center - 1:+.1%} to "
                  f"{math.exp(band.center + band.half_width) / center - 1:+.1%})")
    else:
        verdict, reason = "pass", f"{change:+.1%}: within the band and the threshold"
    return MetricVerdict(metric, store_name, unit, better, mine.value, center,
                         math.exp(band.center - band.half_width), math.exp(band.center + band.half_width), change,
                         band.t_score(x), band.p_two_sided(x), outside, above, verdict, reason, values,
                         list(mine.excluded_steps), mine.num_steps, mine.step_spread_frac)


def _of_benchmark(candidate: RunSummary) -> str:
    return f" for benchmark {candidate.benchmark!r}" if candidate.benchmark else " for runs without a benchmark name"
