"""Trace ingest: the one place that reads trace files, on a columnar engine (see ``engine``).

Outside the algorithmic core on purpose (the core does no I/O; the import contract keeps
it from importing this package or the engine): the readers here stream the public traces'
shards through DuckDB, merge and aggregate them there with bounded memory, and hand the
core plain arrays (:mod:`cellpilot.workloads.google_traces`, :mod:`cellpilot.workloads.vm_trace`).
"""
