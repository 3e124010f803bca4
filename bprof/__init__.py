"""bprof: where the time of a distributed training step goes, on every rank.

Importing bprof never imports torch; only bprof.profiler and bprof.replay do.
"""

__version__ = "0.1.0"
