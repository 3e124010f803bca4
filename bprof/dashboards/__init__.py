"""Dash web report and static HTML export; read-only over the store."""
