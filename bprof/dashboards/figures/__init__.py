"""Figures: plain functions `fig_<thing>(con, run_id, ...) -> plotly Figure`, shared by the Dash app
and the HTML export. Each aggregates on the SQL side: a figure never carries more points than a
browser can draw (one per rank and step at most, or a bounded sample, said so in its title)."""
