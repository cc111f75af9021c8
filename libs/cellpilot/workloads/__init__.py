"""Workload generators and trace readers (DESIGN.md: usage and lifetime generators, trace readers).

Modules are imported directly, e.g. ``cellpilot.workloads.cell_workload`` (synthetic Borg
cells and jobs) or ``cellpilot.workloads.gpa_tasks`` (instantaneous CPU usage for GPA).
"""
