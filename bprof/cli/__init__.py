"""The bprof command line: one module per command group."""
