"""Builders for the Borglet's plain data (:mod:`cellpilot.borglet.hosted_task`)."""

from __future__ import annotations

from cellpilot.borglet.hosted_task import Limits, SimulatedPlan, TaskPlan


def task_plan(job: str = "u/j", index: int = 0, incarnation: int = 1, spec_version: int = 1) -> TaskPlan:
    """A simulated task's plan: steady usage, no limits, hard memory limit."""
    return TaskPlan(
        job_id=job,
        task_index=index,
        incarnation=incarnation,
        priority=0,
        band=0,
        limits=Limits(),
        hard_memory_limit=True,
        runtime=SimulatedPlan("steady", ()),
        spec_version=spec_version,
    )
