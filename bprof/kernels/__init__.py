"""Kernel-name catalogue, cost models and device peak table."""
