"""Workload generators: synthetic Autopilot jobs, Borg cells, GPA tasks and VM populations, and
the Google trace formats they share with the trace readers (the usage models and the rest of
the world model are :mod:`cellpilot.world`).

Trace readers live in ``cellpilot.traces`` (file I/O, outside the pure core).

Modules are imported directly, e.g. ``cellpilot.workloads.cell_workload`` (synthetic Borg
cells and jobs) or ``cellpilot.workloads.gpa_tasks`` (instantaneous CPU usage for GPA).
"""
