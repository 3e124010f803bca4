"""What-if: replay each step's dependency graph (per-rank chains of work between matched
collectives) with changed work, transfers or ranks, to predict what a fix or a change buys.
Imports only the store level (numpy, numba, duckdb), never analyzers, torch or dash."""
