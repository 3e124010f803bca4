"""Runs inside HolisticTraceAnalysis 0.5.0's own venv (benchmarks/hta_parity.py starts it): prints,
as JSON, HTA's per-rank temporal breakdown and comm-compute overlap for one trace folder.

    bench-data/hta-venv/bin/python benchmarks/_hta_breakdown.py TRACE_DIR

Breakdown fractions are HTA's unrounded ratios (its *_pctg columns are these x100, rounded to 2
digits); the overlap is its comp_comm_overlap_pctg / 100 (HTA returns no unrounded value);
times are HTA's integer microseconds, and `window_start_us` is on HTA's clock (the trace's own
`ts` values, as HTA keeps them, plus its alignment shift `min_ts_us`).
"""

from __future__ import annotations

import json
import logging
import math
import sys
import warnings


def main(trace_dir: str) -> None:
    logging.disable(logging.CRITICAL)
    warnings.simplefilter("ignore")  # HTA divides 0 by 0 for the overlap of a rank without communication
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=trace_dir)
    temporal = ta.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = ta.get_comm_comp_overlap(visualize=False).set_index("rank")
    ranks = []
    for rank in sorted(ta.t.traces):
        df = ta.t.traces[rank]
        gpu = df[df["stream"].ne(-1)]  # the events get_temporal_breakdown measures
        start_us = int(gpu["ts"].min()) + int(ta.t.min_ts)
        row = temporal.loc[rank]
        # get_comm_comp_overlap returns only the percentage, rounded to 2 digits
        ratio = float(overlap.loc[rank, "comp_comm_overlap_pctg"]) / 100
        ranks.append({
            "rank": int(rank),
            "window_start_us": start_us,
            "window_dur_us": int(row["kernel_time(us)"]),
            "idle_frac": float(row["idle_time(us)"] / row["kernel_time(us)"]),
            "compute_frac": float(row["compute_time(us)"] / row["kernel_time(us)"]),
            "non_compute_frac": float(row["non_compute_time(us)"] / row["kernel_time(us)"]),
            "comm_overlap_frac": None if math.isnan(ratio) or math.isinf(ratio) else ratio,
            "num_gpu_events": int(len(gpu)),
        })
    print(json.dumps({"trace_dir": trace_dir, "ranks": ranks}))


if __name__ == "__main__":
    main(sys.argv[1])
