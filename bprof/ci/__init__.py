"""CI gating: per-run robust summaries kept in a history, a regression test of a candidate run against
a baseline series with the cause of a change, change-point detection over a series, and reports."""
