"""`bprof record --watch`: always-on per-iteration telemetry, live straggler scores, triggered windows."""
