"""Offline studies that reproduce the papers' comparisons, and writing their reports.

Studies return plain data; :mod:`cellpilot.evaluate.report` writes ``summary.json``, markdown
tables and PNG plots.
"""
