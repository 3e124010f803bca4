"""How numbers are spelled for display: small percentages keep their digits."""

import pytest

from bprof.cli.analyze import headline
from bprof.dashboards.format import pct


@pytest.mark.parametrize("frac, shown", [
    (0.487, "48.7%"), (1.0, "100.0%"), (0.012, "1.2%"),
    (0.00019, "0.019%"), (0.005, "0.50%"), (0.0000012, "0.00012%"), (-0.00019, "-0.019%"),
    (0.00996, "1.0%"),   # rounds up to 1%: spelled like the larger ones
    (0.0, "0%"), (None, ""),
])
def test_pct_keeps_two_significant_digits_below_one_percent(frac, shown):
    assert pct(frac) == shown


def test_pct_with_more_decimals():
    assert (pct(0.4523, 2), pct(0.00019, 2), pct(0.00005, 2)) == ("45.23%", "0.019%", "0.0050%")


def test_hfu_of_0_019_percent_is_not_printed_as_0_0():
    """`bprof analyze` printed "HFU 0.0%" for an HFU of 0.019%."""
    metrics = {"step_time_ns": {"value": 84_500_000}, "mfu_frac": {"value": None}, "hfu_frac": {"value": 0.00019}}
    assert headline(metrics) == "step time 84.50 ms  MFU not measurable  HFU 0.019%"
