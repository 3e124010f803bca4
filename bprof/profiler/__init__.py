"""Capture: launcher wrapper and the hook injected into every rank (imports torch)."""
