"""Synthetic multi-rank Kineto traces with planted ground truth, for tests and benchmarks.

    from bprof.synth import Scenario, Fault, write_run
    truth = write_run(Scenario(tp=2, pp=2, dp=2, faults=[Fault("slow_rank", rank=3,
                                                                 extra_ns=5_000_000)]), out_dir)

`write_large_trace(path, target_bytes)` streams one huge single-rank trace for memory benchmarks.
Analyzers never import this package; it imports nothing from the rest of bprof.
"""

from .large import write_large_trace
from .scenario import FAULT_DOCS, Fault, Scenario
from .writer import write_run

__all__ = ["FAULT_DOCS", "Fault", "Scenario", "write_large_trace", "write_run"]
