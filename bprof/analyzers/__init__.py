"""Analyses over the store: one module per question, SQL beside Python."""
