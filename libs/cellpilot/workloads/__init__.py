"""Workload generators: usage models, synthetic jobs, cells and VM populations.

Trace readers live in ``cellpilot.traces`` (file I/O, outside the pure core).

Modules are imported directly, e.g. ``cellpilot.workloads.cell_workload`` (synthetic Borg
cells and jobs) or ``cellpilot.workloads.gpa_tasks`` (instantaneous CPU usage for GPA).
"""
