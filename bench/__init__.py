"""Cellpilot benchmarks: run with ``make bench`` (all) or ``make bench BENCH=prefix``."""
