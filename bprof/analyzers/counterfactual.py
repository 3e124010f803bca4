"""The counterfactual engine lives in bprof.whatif.engine (the what-if engine generalises it; there
is one engine). This name stays for the analyzers and tests that import it from here."""

from bprof.whatif.engine import (  # noqa: F401
    Replay, StepGraph, _counting_sort, _dense_instances, _latest_by,
    exit_offsets, replay, replay_in_order, work_segments)
