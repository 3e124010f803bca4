"""Is a candidate run a regression against a baseline series? One run is one draw: its robust summary
is tested against the prediction band of the baseline runs' summaries (bprof.ci.stats), in log space
(noise on step time is relative), after leaving out outlier baseline runs (a cold start). A
regression needs both: outside the band at the requested confidence, and a change larger than the
threshold. Improvements are judged the same way. A candidate inside a band that reaches further
than `max_band_frac` is inconclusive, never a pass: such a band cannot tell a large change from noise.

Works on RunSummary values only (bprof.ci.summary), so it is tested on stored samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median

from bprof.ci.causes import Explanation, explain
from bprof.ci.history import Entry
from bprof.ci.stats import RUN_OUTLIER_Z, outlier_runs, prediction_band, runs_for_width
from bprof.ci.summary import METRICS, RunSummary, comparability, unknown_facts
from bprof.errors import DataError

MIN_BASELINE_RUNS = 5
DEFAULT_BASELINE_RUNS = 10
DEFAULT_METRICS = ("step_time", "mfu")
# amounts per step that load does not change: they join the default metrics when both sides have them
WORK_METRICS = ("executed_flops", "collective_calls", "collective_bytes")


class NotEnoughData(DataError):
    """Too few baseline runs, a metric that is not measurable, or runs that are not comparable (exit 3)."""


@dataclass(frozen=True)
class CheckOptions:
    # keys of summary.METRICS; None: DEFAULT_METRICS and each work metric that the candidate and at
    # least min_baseline_runs of the baseline runs measured
    metrics: tuple[str, ...] | None = None
    threshold_frac: float = 0.03  # a change must be larger than this to count
    confidence: float = 0.99  # two-sided prediction band
    max_band_frac: float = 0.25  # a band reaching further above its center than this cannot pass a run
    num_baseline_runs: int = DEFAULT_BASELINE_RUNS  # the last N comparable runs of the series
    min_baseline_runs: int = MIN_BASELINE_RUNS


@dataclass
class ExcludedRun:
    """A baseline run left out of one metric's band as an outlier."""

    run_name: str
    value: float
    z_score: float  # signed modified z-score of its log value among the baseline runs
    reason: str


@dataclass
class MetricVerdict:
    metric: str  # CLI name (step_time, mfu)
    store_name: str  # step_time_ns, mfu_frac
    unit: str
    better: str  # "lower" or "higher"
    candidate: float
    baseline_center: float  # geometric mean of the kept baseline runs' summaries
    band_low: float
    band_high: float
    band_width_frac: float  # band_high / baseline_center - 1 (the log band: band_low is center / (1 + it))
    baseline_log_sd: float  # sample sd of the kept baseline runs' log summaries
    change_frac: float  # candidate / baseline_center - 1
    t_score: float
    p_value: float  # two-sided, of a baseline-like run lying this far out
    outside_band: bool
    above_threshold: bool
    verdict: str  # regression, improvement, inconclusive or pass
    reason: str
    baseline_runs: list[str]  # the baseline runs that measured the metric ...
    baseline_values: list[float]  # ... and their values, outliers included
    excluded_baseline_runs: list[ExcludedRun]
    candidate_excluded_steps: list[int]
    candidate_num_steps: int
    candidate_step_spread_frac: float | None


@dataclass
class CheckResult:
    status: str  # regression, inconclusive (no regression, but a metric could not be judged) or pass
    candidate: RunSummary
    series: str
    baseline: list[RunSummary]
    skipped_not_comparable: list[str]  # '<run>: <difference>' of series runs left out
    unknown_facts: list[str]
    options: CheckOptions
    verdicts: list[MetricVerdict] = field(default_factory=list)
    explanation: Explanation | None = None
    metrics_left_out: list[str] = field(default_factory=list)  # '<work metric>: why' of defaults not compared
    advice: list[str] = field(default_factory=list)  # what would let an inconclusive check decide

    @property
    def regressions(self) -> list[MetricVerdict]:
        return [v for v in self.verdicts if v.verdict == "regression"]


def check(candidate: RunSummary, series: list[Entry], options: CheckOptions = CheckOptions(),
          series_name: str | None = None) -> CheckResult:
    """Compare `candidate` with the last comparable runs of `series` (oldest first); NotEnoughData when
    the answer cannot be trusted."""
    for m in options.metrics or ():
        if m not in METRICS:
            raise ValueError(f"unknown metric {m!r}")
    with_mfu = options.metrics is None or "mfu" in options.metrics
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
    metrics = options.metrics
    if metrics is None:
        work, result.metrics_left_out = _work_metrics(candidate, baseline, options)
        metrics = DEFAULT_METRICS + work
    for metric in metrics:
        result.verdicts.append(_judge(metric, candidate, baseline, options))
    if result.regressions:
        result.status = "regression"
    elif any(v.verdict == "inconclusive" for v in result.verdicts):
        result.status = "inconclusive"
        result.advice = _advice(result)
    worse_is_longer = not any(v.verdict == "improvement" for v in result.verdicts) or bool(result.regressions)
    result.explanation = explain(candidate, baseline, worse_is_longer)
    return result


def _work_metrics(candidate: RunSummary, baseline: list[RunSummary],
                  options: CheckOptions) -> tuple[tuple[str, ...], list[str]]:
    """The work metrics that both sides measured, and why each other one is left out."""
    chosen, left_out = [], []
    for metric in WORK_METRICS:
        store_name = METRICS[metric][0]
        mine = candidate.metrics.get(store_name)
        num_measured = sum(1 for b in baseline if _measured(b, store_name))
        if not _measured(candidate, store_name):
            left_out.append(f"{metric}: the candidate has none ({mine.not_measurable if mine else 'not in its summary'})")
        elif num_measured < options.min_baseline_runs:
            left_out.append(f"{metric}: {num_measured} of the {len(baseline)} baseline runs measured it, "
                            f"need {options.min_baseline_runs}")
        else:
            chosen.append(metric)
    return tuple(chosen), left_out


def _measured(summary: RunSummary, store_name: str) -> bool:
    m = summary.metrics.get(store_name)
    return m is not None and m.value is not None and m.value > 0


def _judge(metric: str, candidate: RunSummary, baseline: list[RunSummary], options: CheckOptions) -> MetricVerdict:
    store_name, unit, better = METRICS[metric]
    mine = candidate.metrics.get(store_name)
    if not _measured(candidate, store_name):
        why = mine.not_measurable if mine else "not in its summary"
        raise NotEnoughData(f"not enough data: {metric} of run {candidate.run_name!r} is not measurable: {why}")
    measured = [b for b in baseline if _measured(b, store_name)]
    if len(measured) < options.min_baseline_runs:
        missing = next((b.metrics[store_name].not_measurable for b in baseline
                        if store_name in b.metrics and b.metrics[store_name].value is None), None)
        raise NotEnoughData(f"not enough data: {len(measured)} of the {len(baseline)} baseline runs measured {metric}, "
                            f"need {options.min_baseline_runs}" + (f" ({missing})" if missing else ""))
    values = [b.metrics[store_name].value for b in measured]
    kept = outlier_runs([math.log(v) for v in values])
    median_log = median(math.log(v) for v in values)
    excluded = [ExcludedRun(measured[i].run_name, values[i], kept.z_scores[i],
                            f"{values[i] / math.exp(median_log) - 1:+.1%} from the median of the "
                            f"{len(values)} baseline runs: modified z-score {kept.z_scores[i]:+.1f}, beyond "
                            f"±{RUN_OUTLIER_Z:g}") for i in kept.excluded]
    band = prediction_band(kept.values, options.confidence)
    x = math.log(mine.value)
    kept_values = [values[i] for i in range(len(values)) if i not in kept.excluded]
    # equal values (a work metric of unchanged runs) are their own center: exp(log(v)) rounds
    center = kept_values[0] if min(kept_values) == max(kept_values) else math.exp(band.center)
    low, high = center * math.exp(-band.half_width), center * math.exp(band.half_width)
    change = mine.value / center - 1.0
    outside = band.outside(x)
    above = abs(change) > options.threshold_frac
    worse = change > 0 if better == "lower" else change < 0
    of_runs = f"{band.num_runs} baseline runs" + (f" ({len(excluded)} outlier run(s) left out)" if excluded else "")
    spans = f"spans {low / center - 1:+.1%} to {high / center - 1:+.1%}"
    if outside and above:
        verdict = "regression" if worse else "improvement"
        reason = (f"{'worse' if worse else 'better'} by {abs(change):.1%}: outside the {options.confidence:.0%} "
                  f"band of {of_runs} and above the {options.threshold_frac:.1%} threshold")
    elif outside:
        verdict = "pass"
        reason = (f"{change:+.1%} is outside the {options.confidence:.0%} band but within the "
                  f"{options.threshold_frac:.1%} threshold")
    elif band.width_frac > options.max_band_frac:
        verdict = "inconclusive"
        reason = (f"{change:+.1%} cannot be told from noise: the {options.confidence:.0%} band of {of_runs} {spans}, "
                  f"wider than the ±{100 * options.max_band_frac:g}% limit")
    elif above:
        verdict = "pass"
        reason = f"{change:+.1%} is within the baseline's noise (the {options.confidence:.0%} band {spans})"
    else:
        verdict, reason = "pass", f"{change:+.1%}: within the band and the threshold"
    return MetricVerdict(metric, store_name, unit, better, mine.value, center, low, high, band.width_frac, band.sd,
                         change, band.t_score(x), band.p_two_sided(x), outside, above, verdict, reason,
                         [b.run_name for b in measured], values, excluded,
                         list(mine.excluded_steps), mine.num_steps, mine.step_spread_frac)


def _advice(result: CheckResult) -> list[str]:
    """What would let an inconclusive check decide: more runs (how many, at this spread), a quieter
    runner, and the work metrics."""
    o = result.options
    unclear = [v for v in result.verdicts if v.verdict == "inconclusive"]
    widest = max(unclear, key=lambda v: v.band_width_frac)
    n = len(widest.baseline_values) - len(widest.excluded_baseline_runs)
    needed = runs_for_width(widest.baseline_log_sd, o.confidence, o.max_band_frac)
    spread = f"the baseline runs' {widest.metric} varies by {widest.baseline_log_sd:.1%} (sd of the log values)"
    if needed is None:
        runs = f"more baseline runs will not do it alone: {spread}, too much for any number of runs to bring the " \
               f"{o.confidence:.0%} band within ±{100 * o.max_band_frac:g}%"
    else:
        runs = (f"more baseline runs: {spread}; at that spread {needed} runs bring the {o.confidence:.0%} band "
                f"within ±{100 * o.max_band_frac:g}%, {n} were used (add runs with `bprof ci record RUN --branch "
                f"{result.series}`" + (f", and check with `--baseline-runs {needed}`" if needed > o.num_baseline_runs
                                       else "") + ")")
    advice = [runs, "a quieter runner: a machine of its own (no other jobs or tests beside the run), fixed CPU "
                    "frequency, the same runner type for the baseline and the candidate"]
    work = [v for v in result.verdicts if v.metric in WORK_METRICS]
    if work:
        same = all(v.change_frac == 0 for v in work)
        advice.append("the work metrics, which load does not move, were compared: "
                      + (f"{', '.join(v.metric for v in work)} unchanged: the candidate does the same work as the "
                         f"baseline runs" if same else
                         "; ".join(f"{v.metric} {v.change_frac:+.1%} ({v.verdict})" for v in work)))
    elif result.metrics_left_out:
        advice.append("the work metrics, which load does not move, could not be compared: "
                      + "; ".join(result.metrics_left_out))
    else:
        advice.append("the work metrics, which load does not move: --metric executed_flops --metric collective_calls "
                      "--metric collective_bytes")
    return advice


def _of_benchmark(candidate: RunSummary) -> str:
    return f" for benchmark {candidate.benchmark!r}" if candidate.benchmark else " for runs without a benchmark name"
