"""Findings that break a physical invariant reach the user as not_measurable, their number withheld."""

from bprof.analyzers.base import Finding
from bprof.analyzers.invariants import bounded


def _f(lost_ns, **evidence):
    return Finding("critical", "Straggler", "advice", "detail", lost_ns, evidence)


def test_a_finding_above_the_step_of_its_rank_is_withheld_with_the_reason():
    out = bounded([_f(121_000_000, ranks=[1]), _f(50_000_000, ranks=[1])], {0: 80_000_000, 1: 78_000_000})
    assert out[0].severity == "not_measurable" and out[0].lost_ns is None
    assert "exceeds the step of rank 1 (78.00 ms)" in out[0].detail and out[0].evidence["withheld_lost_ns"] == 121_000_000
    assert out[1].severity == "critical" and out[1].lost_ns == 50_000_000


def test_the_bound_is_the_job_step_without_named_ranks_and_negative_times_are_withheld():
    out = bounded([_f(90_000_000), _f(70_000_000, rank=0), _f(-1)], {0: 60_000_000, 1: 80_000_000})
    assert [f.severity for f in out] == ["not_measurable", "not_measurable", "not_measurable"]
    assert "the job" in out[0].detail and "rank 0 (60.00 ms)" in out[1].detail and "negative" in out[2].detail
    assert bounded([_f(79_000_000)], {0: 60_000_000, 1: 80_000_000})[0].lost_ns == 79_000_000


def test_without_spans_and_without_numbers_findings_pass_unchanged():
    f = _f(10, ranks=[3])
    assert bounded([f], {}) == [f]
    nm = Finding("not_measurable", "t", "a", "d", None, {})
    assert bounded([nm], {0: 1}) == [nm]


def test_mfu_above_100_percent_is_withheld_and_says_which_input_is_wrong():
    from bprof.analyzers.metrics import _bounded

    metrics = {"mfu_frac": (1.7, "frac"), "hfu_frac": (0.4, "frac")}
    out = _bounded(metrics)
    assert metrics["mfu_frac"] == (None, "frac") and metrics["hfu_frac"] == (0.4, "frac")
    assert [f.severity for f in out] == ["not_measurable"] and "170.0%" in out[0].title
    assert "declared model FLOPs" in out[0].detail


def test_declared_flops_the_executed_ones_contradict_are_flagged_with_the_ratio():
    from bprof.analyzers.metrics import _bounded

    assert _bounded({"mfu_frac": (0.30, "frac"), "hfu_frac": (0.36, "frac")}) == []  # 1.2x: recompute
    [f] = _bounded({"mfu_frac": (0.30, "frac"), "hfu_frac": (0.15, "frac")})  # declared twice what ran
    assert f.severity == "warning" and f.evidence["executed_over_declared"] == 0.5
    [f] = _bounded({"mfu_frac": (0.10, "frac"), "hfu_frac": (0.30, "frac")})
    assert "3.00" in f.title
