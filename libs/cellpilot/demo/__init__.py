"""The ``cellpilot run`` demo: a mixed workload on the simulated fleet, watched by Autopilot."""

from cellpilot.demo.workload import (
    DEMO_JOBS,
    DEMO_USER,
    EXAMPLE_USERS,
    DemoJob,
    grant_demo_quotas,
    submit_demo_workload,
)

__all__ = ["DEMO_JOBS", "DEMO_USER", "EXAMPLE_USERS", "DemoJob", "grant_demo_quotas", "submit_demo_workload"]
