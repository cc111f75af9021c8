"""Recommender workers: ``usage.histograms`` (+ OOMs on ``borg.events``) -> ``recommendations``.

Autopilot §3.1-§3.3; see :mod:`cellpilot_services.recommender.worker`.
"""
