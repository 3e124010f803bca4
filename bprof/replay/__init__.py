"""Replay of recorded kernels and collectives on real hardware (imports torch)."""
