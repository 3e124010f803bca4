"""The gate's decisions and explanations on stored per-run summaries of real recordings."""

from __future__ import annotations

from dataclasses import replace

import pytest

from xml.etree import ElementTree as ET

from bprof.ci.check import CheckOptions, NotEnoughData, check
from bprof.ci.report import check_data, check_junit, check_markdown
from bprof.ci.summary import MetricSummary, comparability
from tests.ci.samples import load, series, with_facts

LOADED = load("loaded_machine")
BASES = [LOADED[f"base{i}"] for i in range(1, 9)]
GATE = load("ci_gate_run1")
GATE_BASES = [GATE[f"base{i:02d}"] for i in range(10)]


def scaled(summary, factor: float, name: str):
    """The summary of a run whose steps all took `factor` times as long (MFU divided by it)."""
    m = summary.metrics
    return replace(summary, run_name=name, fingerprint=name, metrics={
        "step_time_ns": replace(m["step_time_ns"], value=m["step_time_ns"].value * factor),
        "mfu_frac": replace(m["mfu_frac"], value=m["mfu_frac"].value / factor)})


def quiet(factors: list[float]) -> list:
    """Baseline runs of base8 scaled by `factors`: a quiet machine's series (and its cold starts)."""
    return [scaled(LOADED["base8"], f, f"q{i}") for i, f in enumerate(factors)]


QUIET = [1.0, 1.02, 0.99, 1.01, 0.98]


def test_an_unchanged_run_passes_and_the_run_is_never_its_own_baseline():
    result = check(scaled(LOADED["base8"], 1.005, "c"), series([*quiet(QUIET), LOADED["base8"]]))
    assert result.status == "pass" and result.advice == []
    assert [b.run_name for b in result.baseline] == ["q0", "q1", "q2", "q3", "q4", "base8"]
    assert {v.verdict for v in result.verdicts} == {"pass"}
    assert [b.run_name for b in check(LOADED["base8"], series(BASES)).baseline] == [f"base{i}" for i in range(1, 8)]


def test_on_a_loaded_machine_a_real_2x_straggler_is_inconclusive_never_a_pass():
    # base1..8 ran at 72..229 ms per step while the machine was loaded: the 99% band reaches +360%,
    # and slow1's +30% (a real 2x straggler on rank 1) is inside it: the gate cannot judge it
    result = check(LOADED["slow1"], series(BASES), CheckOptions(metrics=("step_time",)))
    [v] = result.verdicts
    assert result.status == v.verdict == "inconclusive" and v.above_threshold and not v.outside_band
    assert v.band_low < v.candidate < v.band_high and v.band_width_frac == pytest.approx(3.597, abs=0.001)
    assert "cannot be told from noise" in v.reason and "wider than the ±25% limit" in v.reason
    runs, runner, work = result.advice
    assert runs.startswith("more baseline runs will not do it alone: the baseline runs' step_time varies by 41.1%")
    assert runner.startswith("a quieter runner")
    assert work.startswith("the work metrics, which load does not move: --metric executed_flops")
    # without the limit it is the band's old pass
    [v] = check(LOADED["slow1"], series(BASES), CheckOptions(metrics=("step_time",), max_band_frac=10.0)).verdicts
    assert v.verdict == "pass" and "within the baseline's noise" in v.reason


def test_one_cold_start_baseline_run_is_left_out_and_a_doubled_step_fails():
    # the case: 5 baseline runs whose first is a cold start 1.58x the others; with it, the
    # band reached +190% and passed a doubled step
    bases = quiet([1.58, 0.98, 1.0, 1.02, 0.99])
    result = check(scaled(LOADED["base8"], 2.0, "slow"), series(bases), CheckOptions(metrics=("step_time",)))
    [v] = result.verdicts
    assert result.status == v.verdict == "regression" and v.change_frac == pytest.approx(2.0 / 0.9975 - 1, abs=0.01)
    [cold] = v.excluded_baseline_runs
    assert (cold.run_name, cold.value) == ("q0", bases[0].metrics["step_time_ns"].value) and cold.z_score > 3.5
    assert cold.reason.startswith("+58.0% from the median of the 5 baseline runs: modified z-score +")
    assert v.baseline_runs == ["q0", "q1", "q2", "q3", "q4"] and len(v.baseline_values) == 5
    assert "4 baseline runs (1 outlier run(s) left out)" in v.reason
    assert v.band_width_frac < 0.25
    text = check_markdown(result)
    assert "Left out of the step_time band as outlier baseline runs: q0 (" in text and "modified z-score" in text
    assert check_data(result)["metrics"][0]["excluded_baseline_runs"][0]["run_name"] == "q0"
    # an unchanged rerun passes against the same baseline
    assert check(scaled(LOADED["base8"], 1.0, "same"), series(bases), CheckOptions(metrics=("step_time",))).status == "pass"


def test_an_inconclusive_check_says_what_would_decide_it_and_errors_in_junit():
    # 5 runs spread 5%: the 99% band reaches +32%, over the limit; at that spread 7 runs would do
    bases = quiet([1.0, 1.08, 0.94, 1.03, 0.96])
    result = check(scaled(LOADED["base8"], 1.0, "c"), series(bases), CheckOptions(metrics=("step_time",)))
    [v] = result.verdicts
    assert result.status == v.verdict == "inconclusive" and not v.excluded_baseline_runs
    assert v.band_width_frac == pytest.approx(0.3225, abs=1e-3)
    assert result.advice[0] == ("more baseline runs: the baseline runs' step_time varies by 5.5% (sd of the log values); "
                                "at that spread 7 runs bring the 99% band within ±25%, 5 were used (add runs with "
                                "`bprof ci record RUN --branch main`)")
    text = check_markdown(result)
    assert text.startswith("## bprof ci check: inconclusive\n")
    assert "**Inconclusive**: the baseline is too noisy to pass this run. What would decide it:" in text
    suite = ET.fromstring(check_junit(result))
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("1", "0", "1")
    assert suite.find("testcase/error").get("message").startswith("step_time: ")
    # a limit of 35% lets the same band decide
    assert check(scaled(LOADED["base8"], 1.0, "c"), series(bases),
                 CheckOptions(metrics=("step_time",), max_band_frac=0.35)).status == "pass"


def test_a_band_too_wide_to_pass_still_fails_a_change_beyond_it():
    result = check(scaled(LOADED["base8"], 10.0, "slow"), series(BASES), CheckOptions(metrics=("step_time",)))
    [v] = result.verdicts
    assert result.status == v.verdict == "regression" and v.band_width_frac > 0.25 and v.outside_band


def test_the_explanation_names_the_slow_ranks_compute_and_the_new_straggler():
    e = check(LOADED["slow1"], series(BASES), CheckOptions(metrics=("step_time",))).explanation
    assert e.top_part == "compute" and e.critical_rank == 1
    assert e.parts[0].delta_ns > 0 and not e.parts[0].within_noise
    straggler = next(c for c in e.refinements if c.family == "straggler")
    assert straggler.name == "rank 1" and straggler.baseline_ns == 0 and straggler.candidate_ns > 0
    assert "compute on rank 1" in e.headline and "rank 1 is a new straggler" in e.headline


def test_a_dataloader_stall_is_explained_by_the_data_wait_phase():
    e = check(LOADED["stall"], series(BASES), CheckOptions(metrics=("step_time",))).explanation
    inner = [c for c in e.refinements if c.family == "phase"]
    assert inner[0].name == "data_wait" and inner[0].delta_ns > 0
    assert "phase data_wait" in e.headline


def test_a_planted_4x_slowdown_is_a_regression_on_both_metrics_and_a_4x_speedup_an_improvement():
    slow = check(scaled(GATE["aa-001"], 4.0, "slow"), series(GATE_BASES))
    assert slow.status == "regression"
    assert [(v.metric, v.verdict) for v in slow.verdicts] == [("step_time", "regression"), ("mfu", "regression")]
    step = slow.verdicts[0]
    assert step.change_frac == pytest.approx(4.0 * GATE["aa-001"].metrics["step_time_ns"].value / step.baseline_center - 1)
    assert step.candidate > step.band_high and step.p_value < 0.01
    fast = check(scaled(GATE["aa-001"], 0.25, "fast"), series(GATE_BASES))
    assert fast.status == "pass" and {v.verdict for v in fast.verdicts} == {"improvement"}


def test_ci_gate_run1_the_time_band_passes_nothing_and_the_default_work_metrics_decide():
    # what benchmarks/ci_gate.py measured: baseline runs at 76-168 ms per step, a 99% band up to
    # +149% over their center; unchanged runs and 5%/10% slowdowns alike are inside it, so the time
    # metrics are inconclusive. The work metrics are in both sides' summaries, so they are checked
    # by default: the planted slowdowns' matmul loop is a regression of executed FLOPs, and the
    # unchanged runs stay inconclusive (never a pass), advised that their work is unchanged
    for name, summary in GATE.items():
        if name.startswith("base"):
            continue
        result = check(summary, series(GATE_BASES))
        verdict = {v.metric: v for v in result.verdicts}
        assert list(verdict) == ["step_time", "mfu", "executed_flops", "collective_calls", "collective_bytes"], name
        assert result.metrics_left_out == []
        step = verdict["step_time"]
        assert step.verdict == "inconclusive" and not step.outside_band, name
        assert step.band_width_frac == pytest.approx(1.491, abs=0.001)
        if name.startswith("aa"):
            assert result.status == "inconclusive", name
            assert result.advice[2] == ("the work metrics, which load does not move, were compared: executed_flops, "
                                        "collective_calls, collective_bytes unchanged: the candidate does the same work "
                                        "as the baseline runs"), name
        else:
            assert result.status == "regression" and verdict["executed_flops"].verdict == "regression", name


def test_work_metrics_join_the_defaults_only_when_both_sides_have_them():
    # scaled() keeps step time and MFU only: the candidate has no work metrics, so none is compared
    result = check(scaled(GATE["aa-001"], 1.0, "c"), series(GATE_BASES))
    assert [v.metric for v in result.verdicts] == ["step_time", "mfu"]
    assert result.metrics_left_out == [f"{m}: the candidate has none (not in its summary)"
                                       for m in ("executed_flops", "collective_calls", "collective_bytes")]
    assert "Work metrics not compared: executed_flops: the candidate has none" in check_markdown(result)
    # baseline runs without them (LOADED's): too few measured
    result = check(GATE["aa-001"], series([replace(with_facts(b, **GATE["aa-001"].facts), benchmark="gpt-tiny-cpu2")
                                           for b in BASES]))
    assert result.metrics_left_out[0] == "executed_flops: 0 of the 8 baseline runs measured it, need 5"


def test_outside_the_band_but_under_the_threshold_is_not_a_regression():
    # a baseline with no spread: any change is outside its band, but 2% is under the 3% threshold
    flat = [scaled(LOADED["base8"], 1.0, f"b{i}") for i in range(5)]
    result = check(scaled(LOADED["base8"], 1.02, "c"), series(flat), CheckOptions(metrics=("step_time",)))
    [v] = result.verdicts
    assert v.outside_band and not v.above_threshold and v.verdict == "pass"
    assert check(scaled(LOADED["base8"], 1.04, "c"), series(flat), CheckOptions(metrics=("step_time",))).status == "regression"


def test_too_few_baseline_runs_is_not_enough_data():
    with pytest.raises(NotEnoughData, match=r"^not enough data: 4 baseline runs in series 'main' for benchmark 'gpt-tiny', need 5"):
        check(LOADED["slow1"], series(BASES[:4]))


def test_runs_that_differ_are_refused_naming_the_difference():
    candidate = with_facts(LOADED["slow1"], torch_version="2.14.0", world_size=4)
    bases = [with_facts(b, torch_version="2.13.0") for b in BASES]
    with pytest.raises(NotEnoughData, match=r"^not comparable: run 'slow1' differs from baseline run 'base8' of series "
                                            r"'main': torch_version 2.14.0 \(candidate\) vs 2.13.0 \(baseline\); "
                                            r"world_size 4 \(candidate\) vs 2 \(baseline\)"):
        check(candidate, series(bases))
    # an unknown fact is not a difference, and a different peak matters to MFU only
    assert comparability({"torch_version": None}, {"torch_version": "2.13.0"}, with_mfu=True) == []
    peak = with_facts(LOADED["slow1"], peak_flops_per_s_per_device=1.0)
    check(peak, series(BASES), CheckOptions(metrics=("step_time",)))
    with pytest.raises(NotEnoughData, match="peak_flops_per_s_per_device"):
        check(peak, series(BASES), CheckOptions(metrics=("mfu",)))


def test_an_unmeasurable_mfu_is_not_enough_data_with_the_reason():
    no_peak = replace(LOADED["slow1"], metrics={**LOADED["slow1"].metrics, "mfu_frac": MetricSummary(
        None, "frac", 5, [], None, "the device peak is unknown (run `bprof calibrate` on the host, or analyze with --peak-tflops)")})
    with pytest.raises(NotEnoughData, match=r"mfu of run 'slow1' is not measurable: the device peak is unknown"):
        check(no_peak, series(BASES))


def test_the_stored_summaries_are_medians_of_kept_steps():
    # what the data says of itself: outliers listed, values positive, and with an odd number of kept
    # steps the median MFU is the MFU of the median step: FLOPs / (step x peak x ranks)
    checked = 0
    for s in [*LOADED.values(), *GATE.values()]:
        step, mfu = s.metrics["step_time_ns"], s.metrics["mfu_frac"]
        assert step.value > 0 and step.num_steps == 5 and set(step.excluded_steps) <= set(range(3, 8))
        if (step.num_steps - len(step.excluded_steps)) % 2 == 1:
            peak = s.facts["peak_flops_per_s_per_device"]
            assert mfu.value == pytest.approx(s.facts["model_flops_per_step"] / (step.value * 1e-9 * peak * 2), rel=1e-9)
            checked += 1
    assert checked >= 20


def test_ci_gate_run2_a_load_burst_is_called_and_explained_as_what_it_was():
    # the one A/B call of ci_gate run 2: the candidate carried a planted 9.8 ms on rank 1, but ran +85%
    # slow in a load burst; the explanation shows rank 0's forward and backward compute doubling
    burst = load("ci_gate_run2_burst")
    candidate = burst.pop("ab10-036")
    result = check(candidate, series(list(burst.values())))
    assert result.status == "regression" and [v.verdict for v in result.verdicts] == ["regression", "regression"]
    assert result.verdicts[0].change_frac == pytest.approx(0.855, abs=0.001)
    e = result.explanation
    assert (e.top_part, e.critical_rank) == ("compute", 0)
    assert [c.name for c in e.refinements if c.family == "phase"][:2] == ["backward", "forward"]


WORK = CheckOptions(metrics=("step_time", "mfu", "executed_flops", "collective_calls"))


def test_work_metrics_call_every_planted_slowdown_that_the_time_noise_hides_and_no_unchanged_run():
    # ci_gate run 1 again: the candidates were checked against the baseline runs; the time metrics
    # miss every planted 5%/10% slowdown, but rank 1's planted matmul loop is executed FLOPs that
    # unchanged code never does, whatever the load
    for name, summary in GATE.items():
        if name.startswith("base"):
            continue
        result = check(summary, series(GATE_BASES), WORK)
        verdict = {v.metric: v for v in result.verdicts}
        assert verdict["step_time"].verdict == "inconclusive", name
        assert verdict["collective_calls"].change_frac == 0.0, name
        flops = verdict["executed_flops"]
        if name.startswith("aa"):
            assert result.status == "inconclusive" and flops.change_frac == 0.0 and flops.verdict == "pass", name
            assert not flops.outside_band and result.explanation.work == [], name
            continue
        assert result.status == "regression" and flops.verdict == "regression" and flops.change_frac > 0.2, name
        top = result.explanation.work[0]
        assert (top.family, top.name, top.baseline) == ("work_flops", "rank 1", GATE_BASES[0].metrics[
            "executed_flops_per_step"].value), name
        assert top.candidate == flops.candidate and result.explanation.headline.startswith(
            "executed FLOPs on rank 1 grew +"), name


def test_fewer_executed_flops_is_an_improvement_not_a_pass():
    base = GATE_BASES[0]
    m = base.metrics["executed_flops_per_step"]
    halved = replace(base, run_name="half", fingerprint="half", metrics={
        **base.metrics, "executed_flops_per_step": replace(m, value=m.value / 2)},
        components={**base.components, ("work_flops", "rank 0"): base.components[("work_flops", "rank 0")] // 2})
    result = check(halved, series(GATE_BASES), WORK)
    assert {v.metric: v.verdict for v in result.verdicts}["executed_flops"] == "improvement"
    assert result.explanation.work[0].name == "rank 0" and result.explanation.work[0].change_frac == pytest.approx(-0.5)


def test_the_markdown_names_the_baseline_runs_left_out_as_not_comparable():
    # base1 ran another torch: left out of the baseline, and the report says which and why
    bases = [with_facts(BASES[0], torch_version="2.12.0")] + [with_facts(b, torch_version="2.13.0") for b in BASES[1:]]
    result = check(with_facts(LOADED["base8"], torch_version="2.13.0"), series(bases))
    assert result.skipped_not_comparable == ["base1: torch_version 2.13.0 (candidate) vs 2.12.0 (baseline)"]
    assert ("Left out of the baseline as not comparable: base1: torch_version 2.13.0 (candidate) vs 2.12.0 "
            "(baseline).") in check_markdown(result)
