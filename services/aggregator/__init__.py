"""The aggregator service: raw usage samples -> per-task and per-job 5-minute histograms.

It also serves the Monitoring API from the history it keeps.
"""
