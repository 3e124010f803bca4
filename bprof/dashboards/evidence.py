"""A finding's evidence (the JSON `findings.evidence`) as a short line a reader can take in: the
ranks, the steps and the few numbers that back the claim, each with its unit. The raw JSON stays
beside it (the report's expandable cell, `bprof analyze --json`)."""

from __future__ import annotations

import json

from bprof.dashboards import format as fmt

MAX_NUMBERS = 5        # numbers shown after the ranks and steps
MAX_TEXT_CHARS = 40    # longer strings (item keys, commands) stay in the raw evidence
EPOCH_NS = 10**15      # an _ns value this large is a timestamp, not a duration
SKIPPED = {"advice", "ranks", "steps", "item_key", "scenario"}   # ranks, steps first; the rest only raw


def parse(text: str | None) -> dict:
    """The evidence as a dict (empty when absent); the advice is part of the finding, not of its evidence."""
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {"value": value}


def raw(evidence: dict) -> str:
    """The raw evidence, less its advice, as compact JSON."""
    return json.dumps({k: v for k, v in evidence.items() if k != "advice"}, separators=(", ", ": "), default=str)


def summary(evidence: dict) -> str:
    """`ranks 0-3; steps 3-5; exposed recoverable 6.15 ms; dim dp`: ranks and steps first, then the
    scalar values by their unit suffix (_ns durations, _frac shares, bytes); lists, maps and
    timestamps are left to the raw evidence."""
    parts = []
    for key, noun in (("ranks", "rank"), ("steps", "step")):
        values = [v for v in evidence.get(key) or [] if isinstance(v, int)]
        if values:
            parts.append(f"{noun}{'s' if len(values) > 1 else ''} {spans(values)}")
    numbers = []
    for key, value in evidence.items():
        if key in SKIPPED or key.endswith("_id"):
            continue
        shown = _value(key, value)
        if shown is not None:
            numbers.append(f"{_label(key)} {shown}")
    return "; ".join(parts + numbers[:MAX_NUMBERS])


def spans(values: list[int], most: int = 8) -> str:
    """0-3, 7, 9-10 (consecutive values as ranges; past `most` ranges, a count of the rest)."""
    values = sorted(set(values))
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:most])
    return text + (f" (+{len(runs) - most} more)" if len(runs) > most else "")


def _label(key: str) -> str:
    key = key.replace("_frac_", "_")
    for suffix in ("_flops_per_s", "_bytes_per_s", "_ns", "_frac", "_bytes"):
        if key.endswith(suffix):
            key = key[: -len(suffix)]
    return key.replace("_", " ")


def _value(key: str, value) -> str | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, str):
        return value if len(value) <= MAX_TEXT_CHARS else None
    if not isinstance(value, (int, float)):
        return None
    if key.endswith("_ns"):
        return None if key.endswith("ts_ns") or abs(value) >= EPOCH_NS else fmt.ms(value)
    if key.endswith("_frac") or "_frac_" in key:
        return fmt.pct(value)
    if key.endswith("bytes"):
        return fmt.size(value)
    if key.endswith("flops_per_s"):
        return f"{value / 1e12:.3g} TFLOP/s" if value >= 1e12 else f"{value / 1e9:.3g} GFLOP/s"
    if key.endswith("bytes_per_s"):
        return fmt.gbps(value)
    return f"{value:,.3g}" if isinstance(value, float) else f"{value:,}"
